"""TRL's ``GRPOConfig`` and PEFT's ``LoraConfig`` for a :class:`TrainingConfig`.

TRL, PEFT and torch are imported when a function is called, never at import time, so the
configuration stays usable from a notebook without them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conductor_pipeline.training.configs import TrainingConfig

__all__ = ["grpo_args", "lora_config", "use_bf16"]


def _world_size() -> int:
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def use_bf16(setting: bool | str, use_cpu: bool | None = None) -> bool:
    """Whether training computes in bfloat16 (autocast; the adapter stays float32).
    ``setting`` is ``training.grpo.bf16``: ``true``, ``false``, or ``auto``: where the
    hardware multiplies bfloat16, a CUDA GPU that supports it or a CPU with AMX or
    AVX512-BF16 (elsewhere a CPU emulates it, slower than float32). ``use_cpu``: whether
    training runs on the CPU (``None``: when no GPU is available)."""
    if setting != "auto":
        return bool(setting)
    if use_cpu is None:
        use_cpu = not _cuda_available()
    if use_cpu:
        from conductor_pipeline.workers.local_model import native_bfloat16

        return native_bfloat16()
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


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
    ``micro_batch_size`` per device with gradient accumulation. Precision: :func:`use_bf16`.
    CPU: ``use_cpu``, no gradient checkpointing, no vLLM. Reporting is off
    (``report_to="none"``): metrics go through :class:`MetricsCallback` so that TRL does not
    log its ~220 params to MLflow.
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
        entropy_coef=g.entropy_coef,
        scale_rewards=g.scale_rewards,
        num_iterations=g.num_iterations,
        # the rows are already in the order the steps take them
        shuffle_dataset=not (g.balanced_domains or config.curriculum.reference_worker),
        save_strategy="steps",
        save_steps=g.save_steps,
        save_total_limit=g.save_total_limit,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        seed=config.seed,
        data_seed=config.seed,
        use_cpu=use_cpu,
        bf16=use_bf16(g.bf16, use_cpu),
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
