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
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor_pipeline.distributed import is_main_process, wait_for_everyone
from conductor_pipeline.tasks import Task
from conductor_pipeline.training.configs import (
    SMOLLM2,
    TrainingConfig,
    stable_hash,
)
from conductor_pipeline.training.rewards import (
    ConductorReward,
    RolloutStats,
    ScoredBatch,
    task_columns,
)
from conductor_pipeline.workers.pricing import pool_token_prices
from conductor_pipeline.workers.types import WorkerCaller
from conductor_pipeline.workflow import (
    Budget,
    PromptConfig,
    conductor_messages,
    shown_worker_descriptions,
)
from conductor_pipeline.workflow.config import prompt_config as conductor_prompt_config

__all__ = [
    "MetricsCallback",
    "conductor_trainer_class",
    "PoolInfo",
    "TrainingResult",
    "build_prompt_dataset",
    "data_version",
    "grpo_args",
    "train_conductor",
]

log = logging.getLogger(__name__)

LogMetrics = Callable[[dict[str, float], int], None]

ADAPTER_INFO_FILE = "conductor_info.json"
ROLLOUT_SAMPLES_FILE = "rollout_samples.jsonl"
# sub-folder of a trained adapter holding the same run's warm-start (SFT-only) adapter
WARM_START_DIR = "warm_start"


class RolloutSampleLog:
    """Appends a few rollouts per step to a JSONL file (``stage``, ``step``, ``question``,
    ``completion``, ``reward``, ``parsed``, ``masked``, ``correct``, ``workers``), for the
    training report's early-vs-late examples. ``per_step`` rows: the first rollout of each
    group, then the next ones."""

    def __init__(self, path: Path, stage: str, *, per_step: int = 4, step_offset: int = 0) -> None:
        self.path = path
        self.stage = stage
        self.per_step = per_step
        self.step_offset = step_offset

    def forget_after(self, step: int) -> None:
        """Drop this stage's rows after ``step`` (they are recomputed after a resume)."""
        if not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row.get("stage") == self.stage and row.get("step", 0) > step:
                continue
            kept.append(line)
        self.path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")

    def __call__(self, batch: ScoredBatch) -> None:
        if batch.step is None or not batch.scores:
            return
        rows = []
        for i in range(min(self.per_step, len(batch.scores))):
            score = batch.scores[i]
            rows.append(
                {
                    "stage": self.stage,
                    "step": self.step_offset + batch.step,
                    "question": batch.tasks[i].question,
                    "completion": batch.texts[i],
                    "reward": score.reward,
                    "parsed": score.parsed,
                    "masked": score.masked,
                    "correct": score.correct,
                    "workers": score.workers,
                }
            )
        with self.path.open("a", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")


# -- the pool as training sees it -----------------------------------------------------------------


@dataclass
class PoolInfo:
    """What training needs from a worker pool: the caller, names, descriptions, prices.

    ``prices[i]`` is ``(dollars per prompt token, dollars per completion token)`` or
    ``None`` when unknown. A ``WorkerPool`` converts with :meth:`from_pool`, which prices
    workers as evaluation does (:func:`~conductor_pipeline.workers.pricing.token_prices`).
    """

    call: WorkerCaller
    names: list[str]
    descriptions: list[str]
    prices: list[tuple[float, float] | None] = field(default_factory=list)

    @classmethod
    def from_pool(cls, pool: Any) -> PoolInfo:
        return cls(pool, list(pool.names), list(pool.descriptions), pool_token_prices(pool))

    def fingerprint(self) -> str:
        """Hash of worker names and prices (never endpoints or keys)."""
        prices = [list(p) if p else None for p in self.prices]
        return stable_hash({"names": self.names, "prices": prices})


# -- prompts and data -------------------------------------------------------------------------------


def data_version(tasks: Sequence[Task]) -> str:
    """Hash of the train split's content (ids, questions, answers, verifiers)."""
    rows = sorted((t.id, t.question, t.answer, t.verifier) for t in tasks)
    return stable_hash(rows)


def _prompt_length(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return len(encoded["input_ids"])


def build_prompt_dataset(
    tasks: Sequence[Task],
    tokenizer: Any,
    worker_descriptions: Sequence[str],
    prompt_config: PromptConfig,
    config: TrainingConfig,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One row per usable train task: ``prompt`` (conversational) plus the task columns.

    Tasks whose question exceeds ``max_question_tokens`` or whose prompt exceeds
    ``max_prompt_tokens`` are dropped (GRPO cannot truncate prompts). ``max_train_tasks``
    keeps a seeded sample. Returns the rows and a small report.
    """
    import random

    chosen = sorted(tasks, key=lambda t: t.id)
    if config.max_train_tasks is not None and len(chosen) > config.max_train_tasks:
        chosen = random.Random(config.seed).sample(chosen, config.max_train_tasks)
        chosen.sort(key=lambda t: t.id)
    rows: list[dict[str, Any]] = []
    long_questions = long_prompts = 0
    for task in chosen:
        if config.max_question_tokens is not None:
            n_question = len(tokenizer(task.question, add_special_tokens=False)["input_ids"])
            if n_question > config.max_question_tokens:
                long_questions += 1
                continue
        messages = conductor_messages(task.question, worker_descriptions, prompt_config)
        if _prompt_length(tokenizer, messages) > config.max_prompt_tokens:
            long_prompts += 1
            continue
        rows.append({"prompt": messages, **task_columns(task)})
    report = {
        "n_tasks": len(tasks),
        "n_considered": len(chosen),
        "n_prompts": len(rows),
        "dropped_long_question": long_questions,
        "dropped_long_prompt": long_prompts,
    }
    if not rows:
        raise ValueError(
            f"no usable training prompts: {report}; raise training.max_prompt_tokens or "
            "training.max_question_tokens"
        )
    return rows, report


# -- TRL configuration ----------------------------------------------------------------------------------


def _world_size() -> int:
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def grpo_args(
    config: TrainingConfig,
    output_dir: str | Path,
    *,
    max_steps: int | None = None,
    use_cpu: bool | None = None,
    world_size: int | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Any:
    """The ``GRPOConfig`` for ``config``.

    Batch: one optimizer step = ``prompts_per_step * num_generations`` completions,
    generated at once (``generation_batch_size``) and processed in micro-batches of
    ``micro_batch_size`` per device with gradient accumulation. CPU: ``use_cpu``, fp32, no
    gradient checkpointing, no vLLM. Reporting is off (``report_to="none"``): metrics go
    through :class:`MetricsCallback` so that TRL does not log its ~220 params to MLflow.
    ``overrides`` are extra ``GRPOConfig`` arguments that win (advanced use, tests).
    """
    from trl import GRPOConfig

    g = config.grpo
    use_cpu = (not _cuda_available()) if use_cpu is None else use_cpu
    world = world_size or _world_size()
    micro = g.micro_batch_size or g.batch_size
    if g.batch_size % (micro * world):
        raise ValueError(
            f"training.grpo: prompts_per_step * num_generations ({g.batch_size}) must be "
            f"divisible by micro_batch_size * processes ({micro} * {world})"
        )
    accumulation = g.batch_size // (micro * world)
    if g.use_vllm and use_cpu:
        raise ValueError("training.grpo.use_vllm needs a CUDA GPU; set it to false on CPU")
    kwargs: dict[str, Any] = {}
    if g.use_vllm:
        kwargs.update(
            use_vllm=True,
            vllm_mode=g.vllm_mode,
            vllm_gpu_memory_utilization=g.vllm_gpu_memory_utilization,
        )
        if g.vllm_mode == "server" and g.vllm_server_base_url:
            kwargs["vllm_server_base_url"] = g.vllm_server_base_url
    values: dict[str, Any] = dict(
        output_dir=str(output_dir),
        max_steps=max_steps if max_steps is not None else g.max_steps,
        num_generations=g.num_generations,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        max_completion_length=g.max_completion_length,
        temperature=g.temperature,
        top_p=g.top_p,
        learning_rate=g.learning_rate,
        lr_scheduler_type=g.lr_scheduler_type,
        warmup_steps=g.warmup_ratio,
        weight_decay=g.weight_decay,
        max_grad_norm=g.max_grad_norm,
        loss_type=g.loss_type,
        beta=g.beta,
        epsilon=g.epsilon,
        scale_rewards=g.scale_rewards,
        num_iterations=1,
        save_strategy="steps",
        save_steps=g.save_steps,
        save_total_limit=g.save_total_limit,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        seed=config.seed,
        data_seed=config.seed,
        use_cpu=use_cpu,
        bf16=bool(g.bf16 and not use_cpu),
        gradient_checkpointing=bool(g.gradient_checkpointing and not use_cpu),
        dataloader_num_workers=0,
        **kwargs,
    )
    values.update(overrides or {})
    return GRPOConfig(**values)


def lora_config(config: TrainingConfig, num_layers: int | None = None) -> Any:
    """The PEFT ``LoraConfig``, or ``None`` when LoRA is disabled (full fine-tune).

    ``num_layers`` (the model's decoder depth) is needed when ``lora.last_layers`` is set.
    """
    if not config.lora.enabled:
        return None
    from peft import LoraConfig

    lora = config.lora
    layers = None
    if lora.last_layers is not None and num_layers is not None:
        first = max(num_layers - lora.last_layers, 0)
        layers = list(range(first, num_layers))
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        layers_to_transform=layers,
        task_type="CAUSAL_LM",
    )


def _num_layers(model: Any) -> int | None:
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    value = getattr(config, "num_hidden_layers", None)
    return int(value) if value else None


# -- metrics ------------------------------------------------------------------------------------------

# TRL log keys worth keeping, with the names they get.
_TRL_KEYS = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "learning_rate",
    "kl": "kl",
    "entropy": "entropy",
    "completions/mean_length": "completions/mean_length",
    "completions/clipped_ratio": "completions/clipped_ratio",
    "frac_reward_zero_std": "reward/frac_zero_std_groups",
    "clip_ratio/region_mean": "clip_ratio",
    "step_time": "step_time_s",
}


def _trainer_callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class MetricsCallback(_trainer_callback_base()):  # type: ignore[misc]
    """Every logged step: curated TRL numbers + rollout statistics → ``log_metrics``.

    Names are ``<prefix><metric>`` (e.g. ``grpo/reward/mean``, ``grpo/workers/share/sim-sage``,
    ``grpo/tokens_per_s``); the step is ``step_offset + global_step``. Every record is also
    appended to ``history``.
    """

    def __init__(
        self,
        stats: RolloutStats,
        log_metrics: LogMetrics | None = None,
        *,
        prefix: str = "grpo/",
        step_offset: int = 0,
        history: list[dict[str, float]] | None = None,
    ) -> None:
        self.stats = stats
        self.log_metrics = log_metrics
        self.prefix = prefix
        self.step_offset = step_offset
        self.history = history if history is not None else []
        self._step_started = time.perf_counter()

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001
        self._step_started = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
        logs = logs or {}
        if "loss" not in logs and "reward" not in logs:
            return  # the end-of-training summary, not a step
        if not getattr(state, "is_world_process_zero", True):
            self.stats.drain()  # multi-process runs: only the main process reports
            return
        metrics: dict[str, float] = {}
        for key, name in _TRL_KEYS.items():
            value = logs.get(key)
            if isinstance(value, int | float) and math.isfinite(value):
                metrics[name] = float(value)
        rollout = self.stats.drain()
        tokens = rollout.pop("rollouts/completion_tokens", 0.0)
        metrics.update(rollout)
        seconds = metrics.get("step_time_s") or (time.perf_counter() - self._step_started)
        if seconds > 0 and tokens:
            metrics["tokens_per_s"] = tokens / seconds
        step = self.step_offset + int(state.global_step)
        record = {f"{self.prefix}{k}": v for k, v in metrics.items()}
        self.history.append({"step": float(step), **record})
        if self.log_metrics is not None:
            try:
                self.log_metrics(record, step)
            except Exception as exc:  # metrics must never stop training
                log.warning("log_metrics failed at step %d: %s", step, exc)


class _QuietMaskedWarning(logging.Filter):
    """TRL warns with the whole prompt for every masked rollout; keep one short line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("All reward functions returned None"):
            record.msg = "a rollout was masked (infrastructure failure); its advantage is 0"
            record.args = ()
        return True


def _install_log_filter() -> None:
    logger = logging.getLogger("trl.trainer.grpo_trainer")
    if not any(isinstance(f, _QuietMaskedWarning) for f in logger.filters):
        logger.addFilter(_QuietMaskedWarning())


# -- models --------------------------------------------------------------------------------------------


def resolve_base_model(base_model: str) -> str:
    """A loadable model path or id: ``smollm2-135m-instruct`` → the offline SmolLM2 copy."""
    if base_model == SMOLLM2:
        from conductor_pipeline.workers.local_model import ensure_smollm2_cache

        return str(ensure_smollm2_cache())
    return base_model


def load_base(config: TrainingConfig) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for ``config.base_model`` (pad token = eos when missing)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_base_model(config.base_model)
    dtype = {
        None: torch.float32,
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
    }[config.grpo.model_dtype]
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model, tokenizer


def _with_adapter(model: Any, adapter_dir: Path | None) -> Any:
    if adapter_dir is None:
        return model
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)


class TrainerPolicy:
    """Round-1 Conductor completions from the model being trained (recursion stage).

    Called from the reward function while the trainer waits for rewards, so the model is
    never used concurrently. No gradient flows through round 1.
    """

    def __init__(
        self, model: Any, tokenizer: Any, *, max_new_tokens: int, temperature: float
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature

    def _generate(self, conversations: list[list[dict[str, str]]]) -> list[str]:
        import torch

        tok = self.tokenizer
        encoded = [
            tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=True)[
                "input_ids"
            ]
            for c in conversations
        ]
        width = max(len(e) for e in encoded)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        ids = torch.tensor([[pad] * (width - len(e)) + list(e) for e in encoded])
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                out = self.model.generate(
                    input_ids=ids.to(device),
                    attention_mask=mask.to(device),
                    max_new_tokens=self.max_new_tokens,
                    do_sample=True,
                    temperature=self.temperature,
                    top_k=0,
                    top_p=1.0,
                    pad_token_id=pad,
                )
        finally:
            if was_training:
                self.model.train()
        return [tok.decode(row[width:], skip_special_tokens=True) for row in out]

    async def complete_batch(self, conversations: list[list[dict[str, str]]]) -> list[str]:
        return await asyncio.to_thread(self._generate, conversations)


# -- the trainer ------------------------------------------------------------------------------------------


@functools.cache
def conductor_trainer_class() -> type:
    """``ConductorGRPOTrainer`` (``training/trainer.py``): TRL's GRPOTrainer with CPU fast
    paths for generation and scoring; imported on first use, as TRL is slow to import."""
    from conductor_pipeline.training.trainer import ConductorGRPOTrainer

    return ConductorGRPOTrainer


# -- the training stage -------------------------------------------------------------------------------


@dataclass
class TrainingResult:
    """What :func:`train_conductor` produced (``to_dict`` is the adapter-info record)."""

    adapter_dir: Path
    run_dir: Path
    base_model: str
    config_fingerprint: str
    data_version: str
    pool_fingerprint: str
    run_fingerprint: str
    global_step: int
    resumed_from: str | None
    dataset: dict[str, int]
    seconds: dict[str, float]
    history: list[dict[str, float]]
    worker_names: list[str]
    conductor_descriptions: list[str]
    prompt: dict[str, Any]
    sft: dict[str, Any] | None = None
    recursion_steps: int = 0
    start_adapter: str | None = None
    # per-step SFT warm-start records (step, loss, grad_norm, learning_rate); not in to_dict
    sft_history: list[dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "adapter_dir": str(self.adapter_dir),
            "run_dir": str(self.run_dir),
            "base_model": self.base_model,
            "config_fingerprint": self.config_fingerprint,
            "data_version": self.data_version,
            "pool_fingerprint": self.pool_fingerprint,
            "run_fingerprint": self.run_fingerprint,
            "global_step": self.global_step,
            "recursion_steps": self.recursion_steps,
            "resumed_from": self.resumed_from,
            "dataset": self.dataset,
            "seconds": self.seconds,
            "rollout_samples": str(self.run_dir / ROLLOUT_SAMPLES_FILE),
            "worker_names": self.worker_names,
            "conductor_descriptions": self.conductor_descriptions,
            "prompt": self.prompt,
            "sft": self.sft,
            "start_adapter": self.start_adapter,
        }


def _last_checkpoint(folder: Path) -> Path | None:
    if not folder.is_dir():
        return None
    from transformers.trainer_utils import get_last_checkpoint

    found = get_last_checkpoint(str(folder))
    return Path(found) if found else None


def _adapter_hash(folder: Path) -> str:
    """Identity of a LoRA folder: sha256 of its config and weight files."""
    if not (folder / "adapter_config.json").is_file():
        raise FileNotFoundError(f"start adapter {folder}: no adapter_config.json there")
    digest = hashlib.sha256()
    for path in sorted(folder.glob("adapter_*")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _adapter_ready(folder: Path) -> bool:
    return (folder / "adapter_config.json").is_file() or (folder / "config.json").is_file()


def _run_grpo_stage(
    *,
    stage: str,
    config: TrainingConfig,
    rows: list[dict[str, Any]],
    pool: PoolInfo,
    descriptions: list[str],
    prompt_config: PromptConfig,
    init_adapter: Path | None,
    stage_dir: Path,
    max_steps: int,
    log_metrics: LogMetrics | None,
    history: list[dict[str, float]],
    step_offset: int,
    recursion: bool,
    callbacks: Sequence[Any],
    grpo_overrides: Mapping[str, Any] | None,
) -> tuple[Any, str | None]:
    from datasets import Dataset

    model, tokenizer = load_base(config)
    model = _with_adapter(model, init_adapter)
    peft_config = lora_config(config, _num_layers(model)) if init_adapter is None else None
    args = grpo_args(config, stage_dir, max_steps=max_steps, overrides=grpo_overrides)
    budget = Budget(
        max_steps=config.budget.max_steps,
        max_tokens=config.budget.max_tokens,
        max_cost_usd=config.budget.max_cost_usd,
    )
    stats = RolloutStats(pool.names)
    # several processes: the main one keeps the samples file (of its share of the rollouts)
    samples = (
        RolloutSampleLog(stage_dir.parent / ROLLOUT_SAMPLES_FILE, stage, step_offset=step_offset)
        if is_main_process()
        else None
    )
    reward = ConductorReward(
        pool.call,
        pool.names,
        descriptions,
        prompt_config,
        config.reward,
        num_generations=config.grpo.num_generations,
        budget=budget,
        prices=pool.prices or None,
        recursion_share=config.recursion.share if recursion else 0.0,
        recursion_discount=config.recursion.discount,
        stats=stats,
        on_scores=samples,
    )
    metrics_cb = MetricsCallback(
        stats, log_metrics, prefix=f"{stage}/", step_offset=step_offset, history=history
    )
    trainer = conductor_trainer_class()(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[metrics_cb, *callbacks],
    )
    # one bar per stage (step/total, ETA, reward mean, parse rate) instead of TRL's log dicts;
    # added after metrics_cb, whose record of the step the bar reads
    from conductor_pipeline.training.progress import grpo_postfix, install_progress

    install_progress(trainer, stage.upper(), grpo_postfix(history, prefix=f"{stage}/"))
    if recursion:
        reward.recursion_policy = TrainerPolicy(
            trainer.model,
            tokenizer,
            max_new_tokens=config.grpo.max_completion_length,
            temperature=config.grpo.temperature,
        )
    checkpoint = _last_checkpoint(stage_dir) if config.resume else None
    if checkpoint is not None:
        log.info("%s: resuming from %s", stage, checkpoint)
    if samples is not None:
        resumed_step = int(checkpoint.name.rsplit("-", 1)[-1]) if checkpoint else 0
        samples.forget_after(step_offset + resumed_step)
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    return trainer, str(checkpoint) if checkpoint else None


def _check_recursion_generation(config: TrainingConfig) -> None:
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
    """
    _check_recursion_generation(config)
    _install_log_filter()
    timings: dict[str, float] = {}
    started = time.perf_counter()
    root = Path(output_dir or config.output_dir)
    descriptions = list(pool.descriptions)
    prompt = dict(prompt or {})
    prompt_config = conductor_prompt_config(prompt)
    train_tasks = list(tasks)
    fingerprints = {
        "config": config.fingerprint(),
        "prompt": stable_hash(prompt),
        "start_adapter": _adapter_hash(Path(start_adapter)) if start_adapter else None,
        "data": data_version(train_tasks),
        "pool": pool.fingerprint(),
        "base_model": config.base_model,
    }
    run_fp = stable_hash(fingerprints)
    run_dir = root / "runs" / run_fp
    run_dir.mkdir(parents=True, exist_ok=True)
    # several processes (accelerate launch): the main one writes the run's files
    main_process = is_main_process()
    if main_process:
        (run_dir / "run.json").write_text(
            json.dumps(
                {"fingerprints": fingerprints, "config": config.to_dict(), "prompt": prompt},
                indent=2,
            )
        )

    _, tokenizer = _load_tokenizer(config)
    rows, report = build_prompt_dataset(train_tasks, tokenizer, descriptions, prompt_config, config)
    log.info("training prompts: %s", report)
    history: list[dict[str, float]] = []

    init_adapter: Path | None = Path(start_adapter) if start_adapter else None
    sft_info: dict[str, Any] | None = None
    sft_history: list[dict[str, float]] = []
    if init_adapter is not None:
        log.info("continuing from adapter %s (no SFT warm start)", init_adapter)
    elif config.sft.enabled:
        if not config.lora.enabled:
            raise ValueError(
                "training.sft.enabled needs training.lora.enabled (the warm start is a LoRA)"
            )
        sft_dir = run_dir / "sft"
        t0 = time.perf_counter()
        if config.resume and _adapter_ready(sft_dir / "adapter"):
            sft_info = {"adapter_dir": str(sft_dir / "adapter"), "reused": True}
            log.info("SFT warm start: reusing %s", sft_dir / "adapter")
        else:
            from conductor_pipeline.training.sft import build_sft_examples, run_sft

            usable = {r["id"] for r in rows}
            sft_tasks = [t for t in train_tasks if t.id in usable]
            examples = build_sft_examples(
                sft_tasks,
                pool.names,
                descriptions,
                prompt_config,
                config.sft,
                seed=config.seed,
            )
            model, tok = load_base(config)
            result = run_sft(
                model,
                tok,
                examples,
                config,
                sft_dir,
                peft_config=lora_config(config, _num_layers(model)),
                log_metrics=log_metrics,  # sft/loss per step
            )
            sft_history = result.history
            sft_info = {
                "adapter_dir": str(result.adapter_dir),
                "steps": result.steps,
                "final_loss": result.final_loss,
                "n_examples": result.n_examples,
                "reused": False,
            }
            if log_metrics is not None and result.final_loss is not None:
                log_metrics({"sft/final_loss": result.final_loss}, 0)
        init_adapter = sft_dir / "adapter"
        timings["sft"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    trainer, resumed = _run_grpo_stage(
        stage="grpo",
        config=config,
        rows=rows,
        pool=pool,
        descriptions=descriptions,
        prompt_config=prompt_config,
        init_adapter=init_adapter,
        stage_dir=run_dir / "grpo",
        max_steps=config.grpo.max_steps,
        log_metrics=log_metrics,
        history=history,
        step_offset=0,
        recursion=False,
        callbacks=callbacks,
        grpo_overrides=grpo_overrides,
    )
    timings["grpo"] = time.perf_counter() - t0
    global_step = int(trainer.state.global_step)
    stage_adapter = run_dir / "grpo" / "final"
    _save(trainer, tokenizer, stage_adapter)
    del trainer

    recursion_steps = 0
    if config.recursion.enabled:
        t0 = time.perf_counter()
        trainer, _ = _run_grpo_stage(
            stage="recursion",
            config=config,
            rows=rows,
            pool=pool,
            descriptions=descriptions,
            prompt_config=prompt_config,
            init_adapter=stage_adapter if config.lora.enabled else None,
            stage_dir=run_dir / "recursion",
            max_steps=config.recursion.max_steps,
            log_metrics=log_metrics,
            history=history,
            step_offset=global_step,
            recursion=True,
            callbacks=callbacks,
            grpo_overrides=grpo_overrides,
        )
        recursion_steps = int(trainer.state.global_step)
        stage_adapter = run_dir / "recursion" / "final"
        _save(trainer, tokenizer, stage_adapter)
        del trainer
        timings["recursion"] = time.perf_counter() - t0

    adapter_dir = run_dir / "adapter"
    if main_process:
        if adapter_dir.exists():
            shutil.rmtree(adapter_dir)
        shutil.copytree(stage_adapter, adapter_dir)
        if sft_info is not None:
            # the same run's SFT-only adapter travels with the trained one (and into the
            # registry), so evaluation can measure what GRPO added on top of the warm start
            shutil.copytree(Path(sft_info["adapter_dir"]), adapter_dir / WARM_START_DIR)
    timings["total"] = time.perf_counter() - started
    result = TrainingResult(
        adapter_dir=adapter_dir,
        run_dir=run_dir,
        base_model=config.base_model,
        config_fingerprint=fingerprints["config"],
        data_version=fingerprints["data"],
        pool_fingerprint=fingerprints["pool"],
        run_fingerprint=run_fp,
        global_step=global_step,
        resumed_from=resumed,
        dataset=report,
        seconds={k: round(v, 2) for k, v in timings.items()},
        history=history,
        worker_names=list(pool.names),
        conductor_descriptions=shown_worker_descriptions(descriptions, prompt_config),
        prompt=prompt,
        sft=sft_info,
        recursion_steps=recursion_steps,
        start_adapter=str(start_adapter) if start_adapter else None,
        sft_history=sft_history,
    )
    if main_process:
        (adapter_dir / ADAPTER_INFO_FILE).write_text(json.dumps(result.to_dict(), indent=2))
    wait_for_everyone()  # the others return once the adapter folder is complete
    return result


def _load_tokenizer(config: TrainingConfig) -> tuple[str, Any]:
    from transformers import AutoTokenizer

    path = resolve_base_model(config.base_model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return path, tokenizer


def _save(trainer: Any, tokenizer: Any, folder: Path) -> None:
    """The trained model (the adapter under LoRA) and tokenizer into a fresh ``folder``.

    Several processes (``accelerate launch``): the main process clears and writes the folder;
    every process takes part in ``Trainer.save_model`` (it gathers sharded weights under
    DeepSpeed ZeRO-3 or FSDP, and writes on the main process only); all wait until it is
    written.
    """
    accelerator = trainer.accelerator
    if accelerator.is_main_process:
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
    accelerator.wait_for_everyone()
    trainer.save_model(str(folder))
    if accelerator.is_main_process:
        tokenizer.save_pretrained(str(folder))
        (folder / "training_args.bin").unlink(missing_ok=True)  # Trainer's pickle: not needed
    accelerator.wait_for_everyone()


def load_adapter_info(adapter_dir: str | Path) -> Mapping[str, Any]:
    """The ``conductor_info.json`` written next to a trained adapter."""
    return json.loads((Path(adapter_dir) / ADAPTER_INFO_FILE).read_text())
