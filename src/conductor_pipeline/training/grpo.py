"""GRPO training of the Conductor with TRL 1.16 (LoRA, CPU sandbox or GPU with vLLM).

:func:`train_conductor` is the whole training stage, MLflow- and Kedro-free: it builds the
prompt dataset from the train split, optionally runs the SFT warm start, runs GRPO with the
workflow-executing reward, optionally runs the recursion fine-tune, and saves the final
adapter. Metrics go to a plain ``log_metrics(dict, step)`` callable (the Kedro node passes
``mlflow.log_metrics``).

Checkpoints and resume. Everything for one run lives in
``<output_dir>/runs/<run fingerprint>/`` where the run fingerprint hashes the training
config (minus operational keys such as ``save_steps``), the train split, the worker pool
(names and prices) and the base model. The Trainer writes ``checkpoint-<step>`` folders
every ``save_steps`` steps (adapter, optimizer, scheduler, RNG states, trainer state).
With ``resume: true`` a later run of the same fingerprint continues from the newest
checkpoint (``trainer.train(resume_from_checkpoint=...)``), so an interruption loses at
most the steps since the last save; a finished SFT warm start is reused as is.

This module is the orchestration; the parts live next to it: ``inputs`` (the pool and the
prompt dataset), ``configs`` (``GRPOConfig`` and ``LoraConfig`` from the training config),
``models`` (loading, adapters, saving), ``callbacks`` (metrics and rollout samples),
``caps`` (the run stops itself at ``training.caps``),
``sft`` (the warm start), ``artifacts`` (the run folder and its records) and ``trainer``
(the GRPOTrainer subclass); other packages import those names from them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor_pipeline.distributed import is_main_process, wait_for_everyone
from conductor_pipeline.hashing import content_hash
from conductor_pipeline.registry import portable_adapter
from conductor_pipeline.tasks import Task
from conductor_pipeline.training.artifacts import (
    ADAPTER_INFO_FILE,
    ROLLOUT_SAMPLES_FILE,
    WARM_START_DIR,
    TrainingResult,
    adapter_hash,
    last_checkpoint,
)
from conductor_pipeline.training.callbacks import (
    LogMetrics,
    MetricsCallback,
    RolloutSampleLog,
    install_log_filter,
)
from conductor_pipeline.training.caps import CapsCallback, RunCaps, TrainingStopped
from conductor_pipeline.training.configs import TrainingConfig
from conductor_pipeline.training.curriculum import (
    VERDICTS_FILE,
    curriculum_order,
    reference_pass,
)
from conductor_pipeline.training.inputs import PoolInfo, build_prompt_dataset, data_version
from conductor_pipeline.training.models import (
    TrainerPolicy,
    conductor_trainer_class,
    load_base,
    load_tokenizer,
    num_layers,
    save_model,
    with_adapter,
)
from conductor_pipeline.training.rewards import ConductorReward
from conductor_pipeline.training.rollout_stats import RolloutStats
from conductor_pipeline.training.sft import WarmStart, sft_warm_start
from conductor_pipeline.training.trainer_args import grpo_args, lora_config
from conductor_pipeline.workflow import Budget, PromptConfig, shown_worker_descriptions
from conductor_pipeline.workflow.config import prompt_config as conductor_prompt_config

__all__ = ["check_recursion_generation", "check_warm_start_prompt", "train_conductor"]

log = logging.getLogger(__name__)


# -- one run ------------------------------------------------------------------------------------


@dataclass
class _Run:
    """What the steps of one training run share."""

    config: TrainingConfig
    pool: PoolInfo
    tasks: list[Task]
    prompt: dict[str, Any]
    prompt_config: PromptConfig
    fingerprints: dict[str, Any]
    fingerprint: str
    run_dir: Path
    log_metrics: LogMetrics | None
    callbacks: Sequence[Any]
    grpo_overrides: Mapping[str, Any] | None
    start_adapter: Path | None = None
    caps: RunCaps | None = None  # training.caps, over every GRPO stage of the run
    rows: list[dict[str, Any]] = field(default_factory=list)
    # the curriculum's questions its reference worker got wrong (None: no curriculum)
    unsolved: set[str] | None = None
    # what build_prompt_dataset kept, and the curriculum's pre-pass
    report: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def descriptions(self) -> list[str]:
        return list(self.pool.descriptions)

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Record the wall time of the block under ``seconds[name]``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - started


@dataclass(frozen=True)
class _Stage:
    """One GRPO stage of a run: ``grpo`` or the ``recursion`` fine-tune after it."""

    name: str
    init_adapter: Path | None
    max_steps: int
    step_offset: int = 0
    recursion: bool = False


def check_recursion_generation(config: TrainingConfig) -> None:
    """Refuse the recursion fine-tune with vLLM generation before anything is trained.

    The recursion stage builds a second trainer after GRPO (with ``use_vllm`` that is a
    second vLLM engine, colocated next to the first one, which is never released) and writes
    round 1 with :class:`TrainerPolicy`, i.e. transformers' ``generate`` on the full policy
    (the 7B model at GPU scale), not the trainer's vLLM. Neither works at that scale, so the
    pairing is an error that names the settings instead of an out-of-memory hours in.
    """
    if config.recursion.enabled and config.grpo.use_vllm:
        raise ValueError(
            "training.recursion.enabled: true cannot be combined with training.grpo.use_vllm: "
            f"true (vllm_mode: {config.grpo.vllm_mode}): the recursion fine-tune would start a "
            "second trainer with a second vLLM engine and write its round-1 workflows with "
            "transformers' generate on the full model instead of vLLM. Set "
            "training.recursion.enabled: false (as conf/gpu does), or train the recursion "
            "stage without vLLM (training.grpo.use_vllm: false)."
        )


def _open_run(
    tasks: Sequence[Task],
    pool: PoolInfo,
    config: TrainingConfig,
    *,
    output_dir: str | Path | None,
    prompt: Mapping[str, Any] | None,
    start_adapter: str | Path | None,
    log_metrics: LogMetrics | None,
    callbacks: Sequence[Any],
    grpo_overrides: Mapping[str, Any] | None,
) -> _Run:
    """Fingerprint the run, create its folder and (main process) write its ``run.json``."""
    prompt = dict(prompt or {})
    train_tasks = list(tasks)
    fingerprints = {
        "config": config.fingerprint(),
        "prompt": content_hash(prompt),
        "start_adapter": adapter_hash(Path(start_adapter)) if start_adapter else None,
        "data": data_version(train_tasks),
        "pool": pool.fingerprint(),
        "base_model": config.base_model,
    }
    run_fp = content_hash(fingerprints)
    run_dir = Path(output_dir or config.output_dir) / "runs" / run_fp
    run_dir.mkdir(parents=True, exist_ok=True)
    # several processes (accelerate launch): the main one writes the run's files
    if is_main_process():
        record = {"fingerprints": fingerprints, "config": config.to_dict(), "prompt": prompt}
        (run_dir / "run.json").write_text(json.dumps(record, indent=2))
    return _Run(
        config=config,
        pool=pool,
        tasks=train_tasks,
        prompt=prompt,
        prompt_config=conductor_prompt_config(prompt),
        fingerprints=fingerprints,
        fingerprint=run_fp,
        run_dir=run_dir,
        log_metrics=log_metrics,
        callbacks=callbacks,
        grpo_overrides=grpo_overrides,
        start_adapter=Path(start_adapter) if start_adapter else None,
        caps=RunCaps(config.caps),
    )


def check_warm_start_prompt(prompt_config: PromptConfig) -> None:
    """Refuse the scripted warm start on a prompt with an assistant prefill: the planner
    writes whole replies, so a prefilled prompt would be answered twice over."""
    if prompt_config.assistant_prefill:
        raise ValueError(
            "training.sft (the scripted warm start) cannot be combined with "
            f"conductor.prompt.assistant_prefill ({prompt_config.assistant_prefill!r}): "
            'set training.sft.enabled to false, or assistant_prefill to ""'
        )


def _warm_start(run: _Run) -> WarmStart:
    """The SFT stage on the train tasks that made it into the prompt dataset."""
    check_warm_start_prompt(run.prompt_config)
    usable = {r["id"] for r in run.rows}
    with run.timed("sft"):
        return sft_warm_start(
            [t for t in run.tasks if t.id in usable],
            run.pool.names,
            run.descriptions,
            run.prompt_config,
            run.config,
            run.run_dir / "sft",
            log_metrics=run.log_metrics,
        )


# -- a GRPO stage -------------------------------------------------------------------------------


def _budget(run: _Run) -> Budget:
    limits = run.config.budget
    return Budget(
        max_steps=limits.max_steps, max_tokens=limits.max_tokens, max_cost_usd=limits.max_cost_usd
    )


def _curriculum_rows(run: _Run) -> list[dict[str, Any]]:
    """The prompt rows in the order of ``training.curriculum``, after its pre-pass (run by
    the main process; the others read its verdicts from the run folder)."""
    settings = run.config.curriculum
    assert settings.reference_worker is not None
    by_id = {t.id: t for t in run.tasks}
    tasks = [by_id[str(row["id"])] for row in run.rows]
    reward = ConductorReward(
        run.pool.call,
        run.pool.names,
        run.descriptions,
        run.prompt_config,
        run.config.reward,
        budget=_budget(run),
        prices=run.pool.prices or None,
    )
    saved = run.run_dir / VERDICTS_FILE
    with run.timed("curriculum"):
        main = is_main_process()
        if main:
            passed = reference_pass(tasks, reward, settings.reference_worker, saved=saved)
        wait_for_everyone()
        if not main:  # reads the verdicts the main process wrote
            passed = reference_pass(tasks, reward, settings.reference_worker, saved=saved)
    run.report.update(passed.report())
    run.unsolved = passed.unsolved
    return curriculum_order(
        run.rows,
        passed.unsolved,
        settings,
        prompts_per_step=run.config.grpo.prompts_per_step,
        balanced_domains=run.config.grpo.balanced_domains,
        seed=run.config.seed,
        steps=run.config.grpo.max_steps,
    )


def _reward(
    run: _Run, stage: _Stage, stats: RolloutStats, samples: RolloutSampleLog | None
) -> ConductorReward:
    """The workflow-executing reward of ``stage``, under the run's per-rollout budget."""
    config = run.config
    return ConductorReward(
        run.pool.call,
        run.pool.names,
        run.descriptions,
        run.prompt_config,
        config.reward,
        num_generations=config.grpo.num_generations,
        budget=_budget(run),
        prices=run.pool.prices or None,
        recursion_share=config.recursion.share if stage.recursion else 0.0,
        recursion_discount=config.recursion.discount,
        stats=stats,
        on_scores=samples,
    )


def _build_trainer(run: _Run, stage: _Stage) -> tuple[Any, RolloutSampleLog | None]:
    """``(trainer, rollout samples log)`` of ``stage``, its progress bar installed and, for
    the recursion stage, its round-1 policy set on the reward."""
    from datasets import Dataset

    from conductor_pipeline.training.progress import grpo_postfix, install_progress

    config, stage_dir = run.config, run.run_dir / stage.name
    model, tokenizer = load_base(config)
    model = with_adapter(model, stage.init_adapter)
    peft_config = lora_config(config, num_layers(model)) if stage.init_adapter is None else None
    args = grpo_args(config, stage_dir, max_steps=stage.max_steps, overrides=run.grpo_overrides)
    stats = RolloutStats(
        run.pool.names, group_size=config.grpo.num_generations, unsolved=run.unsolved
    )
    # several processes: the main one keeps the samples file (of its share of the rollouts)
    samples = (
        RolloutSampleLog(
            run.run_dir / ROLLOUT_SAMPLES_FILE,
            stage.name,
            step_offset=stage.step_offset,
            group_size=config.grpo.num_generations,
        )
        if is_main_process()
        else None
    )
    reward = _reward(run, stage, stats, samples)
    prefix = f"{stage.name}/"
    metrics = MetricsCallback(
        stats, run.log_metrics, prefix=prefix, step_offset=stage.step_offset, history=run.history
    )
    caps = CapsCallback(run.caps or RunCaps(config.caps), metrics)
    trainer = conductor_trainer_class()(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_list(run.rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[metrics, caps, *run.callbacks],
    )
    # one bar per stage (step/total, ETA, reward mean, parse rate) instead of TRL's log dicts;
    # added after the metrics callback, whose record of the step the bar reads
    install_progress(trainer, stage.name.upper(), grpo_postfix(run.history, prefix=prefix))
    if stage.recursion:
        reward.recursion_policy = TrainerPolicy(
            trainer.model,
            tokenizer,
            max_new_tokens=config.grpo.max_completion_length,
            temperature=config.grpo.temperature,
        )
    return trainer, samples


def _run_stage(run: _Run, stage: _Stage, tokenizer: Any) -> tuple[Path, int, str | None]:
    """Train ``stage`` (from its newest checkpoint with ``resume``) and save its model to
    ``<stage>/final``. Returns that folder, the stage's last step and the checkpoint it
    resumed from. ``seconds[stage]`` is the time to build and train."""
    stage_dir = run.run_dir / stage.name
    with run.timed(stage.name):
        trainer, samples = _build_trainer(run, stage)
        checkpoint = last_checkpoint(stage_dir) if run.config.resume else None
        if checkpoint is not None:
            log.info("%s: resuming from %s", stage.name, checkpoint)
        if samples is not None:
            resumed_step = int(checkpoint.name.rsplit("-", 1)[-1]) if checkpoint else 0
            samples.forget_after(stage.step_offset + resumed_step)
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    _portable_run_folder(run)  # the checkpoints stay usable after a move, also when stopped
    if run.caps is not None and run.caps.stop_reason is not None:
        # a cap was reached: the checkpoint of that step is saved; no adapter is published
        raise TrainingStopped(run.caps.stop_reason)
    final = stage_dir / "final"
    save_model(trainer, tokenizer, final)
    return final, int(trainer.state.global_step), str(checkpoint) if checkpoint else None


def _portable_run_folder(run: _Run) -> None:
    """PEFT writes the base model's absolute path into each adapter config and model card
    (checkpoints, ``final``, ``ref``, the SFT adapter); the run folder names it relative to
    the project root instead, so a moved or copied project does not point into its old one
    (main process)."""
    if is_main_process():
        portable_adapter(run.run_dir)


# -- the training stage -------------------------------------------------------------------------


def _publish_adapter(run: _Run, stage_adapter: Path, warm: WarmStart | None) -> Path:
    """Copy the last stage's model to the run's ``adapter`` folder (main process), the SFT
    warm start, when there was one, next to it."""
    adapter_dir = run.run_dir / "adapter"
    if is_main_process():
        if adapter_dir.exists():
            shutil.rmtree(adapter_dir)
        shutil.copytree(stage_adapter, adapter_dir)
        if warm is not None:
            # the same run's SFT-only adapter travels with the trained one (and into the
            # registry), so evaluation can measure what GRPO added on top of the warm start
            shutil.copytree(Path(warm.info["adapter_dir"]), adapter_dir / WARM_START_DIR)
    return adapter_dir


def train_conductor(
    tasks: Sequence[Task],
    pool: PoolInfo,
    config: TrainingConfig,
    *,
    log_metrics: LogMetrics | None = None,
    output_dir: str | Path | None = None,
    prompt: Mapping[str, Any] | None = None,
    start_adapter: str | Path | None = None,
    callbacks: Sequence[Any] = (),
    grpo_overrides: Mapping[str, Any] | None = None,
) -> TrainingResult:
    """Train the Conductor on ``tasks`` (the train split) with workers from ``pool``.

    ``prompt`` is the ``conductor.prompt`` mapping (null: the defaults of ``PromptConfig``):
    the Conductor is trained on the prompt it is evaluated and served with, and the mapping
    is stored with the adapter and is part of the run fingerprint.

    ``start_adapter``: a LoRA folder to continue from (scheduled retraining starts from the
    champion's adapter); it replaces the SFT warm start, and a hash of its weights is part
    of the run fingerprint, so a new champion starts a new run folder.

    Stages: SFT warm start (``config.sft.enabled``), GRPO (``config.grpo``), recursion
    fine-tune (``config.recursion.enabled``). Returns where the final adapter is and the
    fingerprints that identify the run. ``callbacks`` are extra ``TrainerCallback``s for
    the GRPO stages (tests use one to interrupt a run); ``grpo_overrides`` extra
    ``GRPOConfig`` arguments (not part of the fingerprint).

    Raises :class:`TrainingStopped` when a ``training.caps`` cap stops the run (the
    checkpoint of the step it stopped at is kept; no adapter is published).
    """
    check_recursion_generation(config)
    install_log_filter()
    started = time.perf_counter()
    run = _open_run(
        tasks,
        pool,
        config,
        output_dir=output_dir,
        prompt=prompt,
        start_adapter=start_adapter,
        log_metrics=log_metrics,
        callbacks=callbacks,
        grpo_overrides=grpo_overrides,
    )
    _, tokenizer = load_tokenizer(config)
    run.rows, run.report = build_prompt_dataset(
        run.tasks, tokenizer, run.descriptions, run.prompt_config, config
    )
    if config.curriculum.reference_worker:
        run.rows = _curriculum_rows(run)
    log.info("training prompts: %s", run.report)

    warm: WarmStart | None = None
    init_adapter = run.start_adapter
    if init_adapter is not None:
        log.info("continuing from adapter %s (no SFT warm start)", init_adapter)
    elif config.sft.enabled:
        warm = _warm_start(run)
        init_adapter = warm.adapter_dir

    grpo = _Stage("grpo", init_adapter, config.grpo.max_steps)
    stage_adapter, global_step, resumed = _run_stage(run, grpo, tokenizer)
    recursion_steps = 0
    if config.recursion.enabled:
        recursion = _Stage(
            "recursion",
            stage_adapter if config.lora.enabled else None,
            config.recursion.max_steps,
            step_offset=global_step,
            recursion=True,
        )
        stage_adapter, recursion_steps, _ = _run_stage(run, recursion, tokenizer)

    adapter_dir = _publish_adapter(run, stage_adapter, warm)
    _portable_run_folder(run)
    run.seconds["total"] = time.perf_counter() - started
    result = _result(run, adapter_dir, warm, global_step, resumed, recursion_steps)
    if is_main_process():
        (adapter_dir / ADAPTER_INFO_FILE).write_text(json.dumps(result.to_dict(), indent=2))
    wait_for_everyone()  # the others return once the adapter folder is complete
    return result


def _result(
    run: _Run,
    adapter_dir: Path,
    warm: WarmStart | None,
    global_step: int,
    resumed: str | None,
    recursion_steps: int,
) -> TrainingResult:
    """The run's record (``global_step``: GRPO's last step; ``resumed``: the GRPO checkpoint
    it continued from)."""
    fingerprints = run.fingerprints
    return TrainingResult(
        adapter_dir=adapter_dir,
        run_dir=run.run_dir,
        base_model=run.config.base_model,
        config_fingerprint=fingerprints["config"],
        data_version=fingerprints["data"],
        pool_fingerprint=fingerprints["pool"],
        run_fingerprint=run.fingerprint,
        global_step=global_step,
        resumed_from=resumed,
        dataset=run.report,
        seconds={k: round(v, 2) for k, v in run.seconds.items()},
        history=run.history,
        worker_names=list(run.pool.names),
        conductor_descriptions=shown_worker_descriptions(run.descriptions, run.prompt_config),
        prompt=run.prompt,
        sft=warm.info if warm is not None else None,
        recursion_steps=recursion_steps,
        start_adapter=str(run.start_adapter) if run.start_adapter else None,
        sft_history=warm.history if warm is not None else [],
    )
