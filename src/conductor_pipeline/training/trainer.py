"""``ConductorGRPOTrainer``: TRL 1.16's ``GRPOTrainer`` with its rollouts written by the
local generation engine and a grouped scoring pass, on a CPU.

Where stock TRL spends a sandbox step on CPU (SmolLM2-135M, LoRA on the last 8 layers, G
rollouts for each of P prompts):

- Generation runs ``model.generate`` on a left-padded batch of all ``P * G`` rows, so each
  of the G rows of a group prefills the same prompt again; every decoded token then pays
  for ``DynamicCache`` concatenating the whole cache again, for SDPA copying the grouped
  key/value heads (``repeat_kv``, whenever a padding mask is passed), and for
  ``torch.multinomial`` drawing one exponential per vocabulary entry.
- The loss runs prompt + completion through all layers for every row, though the layers
  below the LoRA are frozen and ran on the same tokens in the step's earlier scoring pass
  (the reference model's), and TRL's fused LM head projects every position, prompt and
  padding included, onto the 49k-token vocabulary (it skips them only with Triton, which
  CPUs lack).

So on a CPU, in one process, with plain temperature/top-p sampling:

1. **Rollouts** come from TRL's public ``rollout_func`` hook:
   :func:`~conductor_pipeline.training.rollouts.engine_rollouts` writes them on the engine
   that serves and evaluates the Conductor (one token draw, one attention, one decode loop;
   each distinct prompt prefilled once for its group), recording the hidden states that
   enter the first LoRA layer (:class:`FrozenStates`). Otherwise
   (:func:`~conductor_pipeline.training.rollouts.engine_rollouts_blocker`) TRL generates.
2. **Scoring** (``_get_per_token_logps_and_entropies``, overridden):
   :func:`~conductor_pipeline.training.fast_paths.grouped_completion_logps` runs each prompt
   once with gradients for its group, only the completion tokens on top, and the LM head on
   real completion tokens only, starting at the first LoRA layer from the recorded states
   (the layers below are frozen: they would compute the same states again). Rollouts that
   TRL wrote are recorded by the first scoring pass over them. It checks that it applies and otherwise calls TRL's method (GPU,
   several processes, multimodal inputs, tools, gradient checkpointing, MoE auxiliary losses,
   scaled logits).

Semantics versus stock TRL. Log-probabilities, entropies and LoRA gradients are the stock
ones up to float rounding (``tests/training/test_trainer_fast_path.py``). Completions follow
the same sampling distribution, end tokens and length limit, but not the same random
stream: one seed gives other completions than stock TRL.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from trl import GRPOTrainer

from conductor_pipeline.generation.attention import unwrapped_model
from conductor_pipeline.training.fast_paths import (
    FastPathUnsupported,
    FrozenStates,
    first_trainable_layer,
    grouped_completion_logps,
)
from conductor_pipeline.training.fast_paths.layers import backbone_and_head
from conductor_pipeline.training.rollouts import engine_rollouts, engine_rollouts_blocker

__all__ = ["ConductorGRPOTrainer"]


# -- the trainer -----------------------------------------------------------------------------

# Head settings TRL's fused LM head applies and the grouped scoring does not.
_HEAD_SCALES = (
    "final_logit_softcapping",
    "logit_scale",
    "output_multiplier",
    "lm_head_multiplier",
    "logits_scaling",
)


class ConductorGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with the engine's rollouts and grouped scoring (see the module
    docstring); where either does not apply, TRL's own code runs. ``fast_path_calls``
    counts the rollout batches the engine wrote and the scoring passes grouped."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        config = kwargs.get("args")
        if (
            kwargs.get("rollout_func") is None
            and config is not None
            and engine_rollouts_blocker(config, kwargs.get("tools")) is None
        ):
            kwargs["rollout_func"] = engine_rollouts
        with warnings.catch_warnings():
            # TRL marks rollout_func experimental; tests/generation/test_private_hooks.py
            # checks that it is still called as engine_rollouts expects
            warnings.filterwarnings("ignore", message="You are using 'rollout_func'")
            super().__init__(*args, **kwargs)
        self.fast_path_calls = {"generation": 0, "scoring": 0}
        # the hidden states entering the first LoRA layer of the step's rollouts (recorded
        # while generating them, or by the first scoring pass over them)
        self.frozen_states: FrozenStates | None = None
        # fixed now, while the adapter being trained is the active one: the reference pass
        # disables it (or switches to a "ref" copy), which changes which parameters require
        # gradients, not the layers below the adapter
        self.frozen_layer = first_trainable_layer(self.accelerator.unwrap_model(self.model))

    def _cpu_blocker(self) -> str | None:
        """Why grouped scoring cannot run here, or ``None``."""
        if self.accelerator.device.type != "cpu":
            return "not on CPU"
        if self.accelerator.num_processes != 1:
            return "several processes"  # the unwrapped model would bypass gradient sync
        if self.use_vllm or getattr(self, "use_transformers_continuous_batching", False):
            return "vLLM or continuous batching"
        if self._is_vlm or self.tools:
            return "multimodal model or tools"
        return None

    # -- scoring --

    def _scoring_blocker(self, model: Any) -> str | None:
        blocker = self._cpu_blocker()
        if blocker is not None:
            return blocker
        if self.args.gradient_checkpointing:
            return "gradient checkpointing"  # checkpointed layers drop the prompt cache
        if self.args.cast_lm_head_to_fp32:
            return "fp32 LM head"
        text_config = unwrapped_model(model).config.get_text_config()
        if any(getattr(text_config, name, None) is not None for name in _HEAD_SCALES):
            return "scaled or soft-capped logits"
        return None

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **extra: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        unwrapped = self.accelerator.unwrap_model(model)
        if (
            not compute_aux_loss
            and all(value is None for value in extra.values())
            and self._scoring_blocker(unwrapped) is None
        ):
            first = self.frozen_layer
            record = FrozenStates(backbone_and_head(unwrapped)[0], first) if first else None
            try:
                with self.accelerator.autocast():
                    logps, entropies = grouped_completion_logps(
                        unwrapped,
                        input_ids,
                        attention_mask,
                        logits_to_keep,
                        temperature=self.temperature,
                        compute_entropy=compute_entropy,
                        entropy_requires_grad=bool(self._entropy_bonus_enabled),
                        batch_size=batch_size,
                        frozen=self.frozen_states,
                        record=record,
                    )
                if record is not None and record.rollouts:  # this batch's states, recorded
                    self.frozen_states = record
                self.fast_path_calls["scoring"] += 1
                return logps, entropies, None
            except FastPathUnsupported:
                pass
        return super()._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=batch_size,
            compute_entropy=compute_entropy,
            compute_aux_loss=compute_aux_loss,
            **extra,
        )
