"""Models for training: the base model and its tokenizer, adapters on it, the trainer class,
saving a stage's result, and the policy that writes round 1 of the recursion stage.

torch, transformers, PEFT and TRL are imported inside the functions (they are slow to
import and a notebook reading configs should not pay for them).
"""

from __future__ import annotations

import asyncio
import functools
import shutil
from pathlib import Path
from typing import Any

from conductor_pipeline.training.configs import SMOLLM2, TrainingConfig
from conductor_pipeline.workers.local_model import load_pretrained, load_pretrained_tokenizer
from conductor_pipeline.workers.torch_thread import set_torch_threads
from conductor_pipeline.workflow.adapter_base import check_adapter_base

__all__ = [
    "TrainerPolicy",
    "base_dtype",
    "conductor_trainer_class",
    "load_base",
    "load_tokenizer",
    "num_layers",
    "resolve_base_model",
    "save_model",
    "with_adapter",
]


def resolve_base_model(base_model: str) -> str:
    """A loadable model path or id: ``smollm2-135m-instruct`` → the offline SmolLM2 copy."""
    if base_model == SMOLLM2:
        from conductor_pipeline.workers.local_model import ensure_smollm2_cache

        return str(ensure_smollm2_cache())
    return base_model


def base_dtype(config: TrainingConfig) -> str:
    """The precision the base model's weights load in (``training.grpo.model_dtype``):
    ``auto`` is bfloat16 where training computes in bfloat16 (``training.grpo.bf16``, on the
    GPU or CPU training would run on), else float32. The LoRA adapter stays float32 either
    way (PEFT keeps adapters in float32 over a bfloat16 base)."""
    from conductor_pipeline.training.trainer_args import use_bf16

    name = config.grpo.model_dtype or "float32"
    if name == "auto":
        return "bfloat16" if use_bf16(config.grpo.bf16) else "float32"
    return name


def load_base(config: TrainingConfig) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for ``config.base_model`` in :func:`base_dtype`'s precision
    (pad token = eos when missing)."""
    import torch

    path = resolve_base_model(config.base_model)
    return load_pretrained(path, getattr(torch, base_dtype(config)))


def with_adapter(model: Any, adapter_dir: Path | None) -> Any:
    """``model`` with the LoRA in ``adapter_dir`` loaded trainable (``None``: unchanged)."""
    if adapter_dir is None:
        return model
    from peft import PeftModel

    base = getattr(model, "name_or_path", None)  # what from_pretrained loaded
    if base:
        check_adapter_base(adapter_dir, str(base), where="training")
    return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)


def load_tokenizer(config: TrainingConfig) -> tuple[str, Any]:
    """``(model path, tokenizer)`` of ``config.base_model`` (pad token = eos when missing)."""
    path = resolve_base_model(config.base_model)
    return path, load_pretrained_tokenizer(path)


def num_layers(model: Any) -> int | None:
    """The decoder depth of ``model`` (``None`` when its config does not say)."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    value = getattr(config, "num_hidden_layers", None)
    return int(value) if value else None


def save_model(trainer: Any, tokenizer: Any, folder: Path) -> None:
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


@functools.cache
def conductor_trainer_class() -> type:
    """``ConductorGRPOTrainer`` (``training/trainer.py``): TRL's GRPOTrainer with CPU fast
    paths for generation and scoring; imported on first use, as TRL is slow to import."""
    from conductor_pipeline.training.trainer import ConductorGRPOTrainer

    return ConductorGRPOTrainer


class TrainerPolicy:
    """Round-1 Conductor completions from the model being trained (recursion stage).

    Called from the reward function while the trainer waits for rewards, so the model is
    never used concurrently. No gradient flows through round 1. It generates in a thread of
    the reward loop's executor, on one torch thread: with more, that thread would keep an
    OpenMP team of its own next to the trainer's, and every later training step would pay
    for it (measured on 2 cores: a SmolLM2 training step 1.27 s before such a thread, 1.40 s
    after; round 1 on one thread about 5 % slower).
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

        set_torch_threads(1)
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
