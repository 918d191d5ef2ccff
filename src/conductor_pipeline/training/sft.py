"""SFT warm start: fine-tune the Conductor's LoRA on scripted reference workflows.

The examples are conversational prompt/completion pairs: the prompt is exactly the GRPO
prompt (``conductor_messages``), the completion is the reference planner's reply. TRL's
SFTTrainer computes the loss on the completion (the assistant turn) only
(``completion_only_loss``, on by default for prompt/completion data). The resulting
adapter is the starting point of GRPO.

On CPU the loss is computed by :func:`completion_loss` rather than TRL's fused LM head,
which without Triton projects every position (prompt included) onto the 49k-token
vocabulary and computes its entropy there, forward and backward: the prompt is most of each
sequence, and none of it carries loss. It also runs the frozen layers below LoRA once per
example, not once per epoch. Same loss and gradients (tested); GPU runs use TRL's path.

Heavy imports (torch, TRL, PEFT) happen inside the functions.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor_pipeline.tasks import Task
from conductor_pipeline.training.artifacts import adapter_ready
from conductor_pipeline.training.configs import SFTSettings, TrainingConfig
from conductor_pipeline.training.models import load_base, num_layers
from conductor_pipeline.training.planner import ReferencePlanner
from conductor_pipeline.training.trainer_args import lora_config, use_bf16
from conductor_pipeline.workflow import PromptConfig, conductor_messages

__all__ = [
    "SFTResult",
    "WarmStart",
    "build_sft_examples",
    "completion_loss",
    "run_sft",
    "sft_loss_recorder",
    "sft_warm_start",
]

log = logging.getLogger(__name__)


@dataclass
class SFTResult:
    adapter_dir: Path
    steps: int
    seconds: float
    final_loss: float | None
    n_examples: int
    skipped: bool = False
    # one record per logged step: step, loss, grad_norm, learning_rate (the loss curve)
    history: list[dict[str, float]] = field(default_factory=list)


_SFT_KEYS = ("loss", "grad_norm", "learning_rate")


def sft_loss_recorder(
    history: list[dict[str, float]],
    log_metrics: Callable[[Mapping[str, float], int], None] | None = None,
) -> Any:
    """A ``TrainerCallback`` that appends every logged SFT step (``step``, ``loss``,
    ``grad_norm``, ``learning_rate``) to ``history`` and sends the loss to ``log_metrics``
    as ``sft/loss`` at that step (MLflow, step-indexed). Only the main process reports."""
    import math

    from transformers import TrainerCallback

    class SFTLossRecorder(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
            logs = logs or {}
            if "loss" not in logs or not getattr(state, "is_world_process_zero", True):
                return  # the end-of-training summary has ``train_loss``, not ``loss``
            step = int(state.global_step)
            record = {"step": float(step)}
            for key in _SFT_KEYS:
                value = logs.get(key)
                if isinstance(value, int | float) and math.isfinite(value):
                    record[key] = float(value)
            history.append(record)
            if log_metrics is not None and "loss" in record:
                try:
                    log_metrics({"sft/loss": record["loss"]}, step)
                except Exception as exc:  # metrics must never stop training
                    log.warning("log_metrics failed at SFT step %d: %s", step, exc)

    return SFTLossRecorder()


def build_sft_examples(
    tasks: Sequence[Task],
    worker_names: Sequence[str],
    worker_descriptions: Sequence[str],
    prompt_config: PromptConfig,
    settings: SFTSettings,
    *,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """``n_examples`` prompt/completion pairs for a seeded sample of ``tasks``.

    Each row also carries ``task_id`` and the planned ``workflow_text`` for inspection.
    """
    planner = ReferencePlanner(
        worker_names, settings, seed=seed, question_to_workers=prompt_config.question_to_workers
    )
    chosen = list(tasks)
    random.Random(seed).shuffle(chosen)
    chosen = chosen[: settings.n_examples]
    rows = []
    for task in chosen:
        plan = planner.plan(task)
        rows.append(
            {
                "prompt": conductor_messages(task.question, worker_descriptions, prompt_config),
                "completion": [{"role": "assistant", "content": plan.text}],
                "task_id": task.id,
            }
        )
    return rows


def completion_loss(
    model: Any,
    inputs: dict[str, Any],
    num_items: Any = None,
    frozen_states: dict[tuple[int, ...], Any] | None = None,
) -> Any:
    """Mean negative log-likelihood of the labelled tokens (``labels`` != -100), computing
    logits only from the earliest labelled position of the batch on (``logits_to_keep``).

    ``labels`` are aligned with ``input_ids`` (the model predicts ``labels[t]`` from the
    positions before ``t``), as in TRL's collator; ``num_items`` is the token count to
    divide by (TRL passes the batch's count), else the labelled tokens here.

    ``frozen_states`` (a dict kept across calls) holds, per example, the hidden states
    entering the first layer LoRA trains, recorded on the example's first pass: the layers
    below it are frozen, so a batch of examples seen before starts there
    (:func:`_recordable_rows` says where this applies).
    """
    import torch

    from conductor_pipeline.generation.local import layer_inputs
    from conductor_pipeline.training.fast_paths.layers import backbone_and_head, run_layers

    labels = inputs["labels"]
    labelled = labels != -100
    width = labels.shape[1]
    if not bool(labelled.any()):
        return labels.new_zeros((), dtype=torch.float32)
    first = int(labelled.any(dim=0).float().argmax())
    keep = width - first + 1  # the position before `first` predicts it
    forward = {k: v for k, v in inputs.items() if k not in ("labels", "completion_mask")}
    # several processes pass no frozen_states: their model is wrapped by DDP, whose gradient
    # sync a pass through the unwrapped layers would bypass
    recordable = _recordable_rows(model, inputs) if frozen_states is not None else None
    if recordable is None:
        logits = model(**forward, use_cache=False, logits_to_keep=keep).logits[:, :-1, :]
    else:
        layer, rows = recordable
        backbone, head = backbone_and_head(model)
        if all(row in frozen_states for row in rows):
            hidden = frozen_states[rows[0]].new_zeros(
                (len(rows), width, backbone.config.hidden_size)
            )
            for i, row in enumerate(rows):
                hidden[i, : len(row)] = frozen_states[row]
            positions = torch.arange(width).expand(len(rows), -1)
            # causal attention alone: the pads come after each row's tokens
            hidden = run_layers(backbone, hidden, positions, None, layer, None)
            logits = head(hidden[:, first - 1 : -1])
        else:
            with layer_inputs(backbone, layer) as seen:
                logits = model(**forward, use_cache=False, logits_to_keep=keep).logits[:, :-1]
            for i, row in enumerate(rows):
                frozen_states.setdefault(row, seen[-1][i, : len(row)].clone())
    targets = labels[:, first:]
    total = torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=-100,
        reduction="sum",
    )
    count = num_items if num_items is not None else labelled.sum()
    return total / torch.as_tensor(count).clamp(min=1)


def _recordable_rows(
    model: Any, inputs: dict[str, Any]
) -> tuple[int, list[tuple[int, ...]]] | None:
    """The first layer LoRA trains, where a batch can start from recorded states, and the
    batch's examples as token tuples (their keys in ``frozen_states``); ``None`` where states
    cannot stand in: no frozen layer below it, a dropout that makes the frozen layers' output
    random, or a batch that is not right-padded (an ``attention_mask`` of ones, then zeros).

    The warm start sees each of its examples about three times (140 steps of 4 over 200),
    and with LoRA on the last 8 of 30 layers the 22 below are most of a step's forward pass.
    """
    import torch

    from conductor_pipeline.training.fast_paths.layers import (
        backbone_and_head,
        first_trainable_layer,
    )

    layer = first_trainable_layer(model)
    mask = inputs.get("attention_mask")
    if layer == 0 or mask is None:
        return None
    if getattr(backbone_and_head(model)[0].config, "attention_dropout", 0.0):
        return None
    lengths = mask.sum(dim=1)
    if not bool((mask == (torch.arange(mask.shape[1]) < lengths[:, None])).all()):
        return None
    ids = inputs["input_ids"]
    return layer, [tuple(row[:n].tolist()) for row, n in zip(ids, lengths.tolist(), strict=True)]


def _trainer_class() -> type:
    from trl import SFTTrainer

    class ConductorSFTTrainer(SFTTrainer):
        """TRL's SFTTrainer whose CPU loss skips the prompt positions and, for an example
        seen before, the frozen layers (module docstring)."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # noqa: ANN001
            if return_outputs or inputs["input_ids"].device.type != "cpu":
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if self.accelerator.num_processes != 1:  # completion_loss says why
                return completion_loss(model, inputs, num_items_in_batch)
            if not hasattr(self, "frozen_states"):  # per example: completion_loss
                self.frozen_states: dict[tuple[int, ...], Any] = {}
            return completion_loss(model, inputs, num_items_in_batch, self.frozen_states)

    return ConductorSFTTrainer


def run_sft(
    model: Any,
    tokenizer: Any,
    examples: Sequence[dict[str, Any]],
    config: TrainingConfig,
    output_dir: str | Path,
    *,
    peft_config: Any = None,
    use_cpu: bool = True,
    log_metrics: Callable[[Mapping[str, float], int], None] | None = None,
    show_progress: bool = True,
) -> SFTResult:
    """Fine-tune ``model`` (wrapped with ``peft_config`` when given) on ``examples`` and
    save the adapter to ``output_dir/adapter``. Returns what happened.

    ``log_metrics(metrics, step)`` gets ``sft/loss`` every step; ``show_progress`` draws
    the stage's progress bar (step/total, ETA, loss) instead of the trainer's log dicts."""
    from datasets import Dataset
    from trl import SFTConfig

    settings = config.sft
    output_dir = Path(output_dir)
    adapter_dir = output_dir / "adapter"
    rows = [{"prompt": r["prompt"], "completion": r["completion"]} for r in examples]
    dataset = Dataset.from_list(rows)
    args = SFTConfig(
        output_dir=str(output_dir / "trainer"),
        max_steps=settings.max_steps,
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=1,
        learning_rate=settings.learning_rate,
        lr_scheduler_type=settings.lr_scheduler_type,
        warmup_steps=min(2, settings.max_steps - 1),
        max_length=settings.max_length,
        # grouping by length pads less (docs/measurements.md, "What the warm start writes")
        train_sampling_strategy="group_by_length" if settings.grouped_batches else "random",
        completion_only_loss=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=config.seed,
        data_seed=config.seed,
        use_cpu=use_cpu,
        bf16=use_bf16(config.grpo.bf16, use_cpu),
        gradient_checkpointing=config.grpo.gradient_checkpointing,
        disable_tqdm=True,  # our bar (training/progress.py) replaces the stock one
        dataloader_num_workers=0,
    )
    history: list[dict[str, float]] = []
    trainer = _trainer_class()(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[sft_loss_recorder(history, log_metrics)],
    )
    from conductor_pipeline.training.progress import install_progress, sft_postfix

    install_progress(trainer, "SFT", sft_postfix, enabled=None if show_progress else False)
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    # several processes (accelerate launch): every one takes part (sharded weights are
    # gathered), the main one writes, the others wait until the adapter is there
    if trainer.accelerator.is_main_process:
        adapter_dir.mkdir(parents=True, exist_ok=True)
    trainer.save_model(str(adapter_dir))
    if trainer.accelerator.is_main_process:
        (adapter_dir / "training_args.bin").unlink(missing_ok=True)  # Trainer's pickle
    trainer.accelerator.wait_for_everyone()
    log.info(
        "SFT warm start: %d steps in %.1f s, final loss %s",
        trainer.state.global_step,
        seconds,
        losses[-1] if losses else None,
    )
    return SFTResult(
        adapter_dir=adapter_dir,
        steps=int(trainer.state.global_step),
        seconds=seconds,
        final_loss=float(losses[-1]) if losses else None,
        n_examples=len(rows),
        history=history,
    )


@dataclass
class WarmStart:
    """The SFT stage as the GRPO run sees it: the adapter GRPO starts from, the record kept
    in the run's adapter info, and the per-step loss records."""

    adapter_dir: Path
    info: dict[str, Any]
    history: list[dict[str, float]] = field(default_factory=list)


def sft_warm_start(
    tasks: Sequence[Task],
    worker_names: Sequence[str],
    worker_descriptions: Sequence[str],
    prompt_config: PromptConfig,
    config: TrainingConfig,
    sft_dir: Path,
    *,
    log_metrics: Callable[[Mapping[str, float], int], None] | None = None,
) -> WarmStart:
    """The warm-start stage of a run: fine-tune a fresh LoRA on reference workflows for
    ``tasks`` into ``sft_dir/adapter``, or with ``config.resume`` reuse the one a previous
    run of the same fingerprint finished there."""
    if not config.lora.enabled:
        raise ValueError(
            "training.sft.enabled needs training.lora.enabled (the warm start is a LoRA)"
        )
    adapter = sft_dir / "adapter"
    if config.resume and adapter_ready(adapter):
        log.info("SFT warm start: reusing %s", adapter)
        return WarmStart(adapter, {"adapter_dir": str(adapter), "reused": True})
    examples = build_sft_examples(
        tasks, worker_names, worker_descriptions, prompt_config, config.sft, seed=config.seed
    )
    model, tokenizer = load_base(config)
    result = run_sft(
        model,
        tokenizer,
        examples,
        config,
        sft_dir,
        peft_config=lora_config(config, num_layers(model)),
        log_metrics=log_metrics,  # sft/loss per step
    )
    if log_metrics is not None and result.final_loss is not None:
        log_metrics({"sft/final_loss": result.final_loss}, 0)
    info = {
        "adapter_dir": str(result.adapter_dir),
        "steps": result.steps,
        "final_loss": result.final_loss,
        "n_examples": result.n_examples,
        "reused": False,
    }
    return WarmStart(adapter, info, result.history)
