"""``ConductorGRPOTrainer``: TRL 1.16's ``GRPOTrainer`` with CPU fast paths for one GRPO step.

Where stock TRL spends a sandbox step on CPU (SmolLM2-135M, LoRA on the last 8 layers, G
rollouts for each of P prompts):

- Generation runs ``model.generate`` on a left-padded batch of all ``P * G`` rows, so each
  of the G rows of a group prefills the same prompt again. Every decoded token then pays
  for ``DynamicCache`` concatenating the whole cache again, for SDPA copying the grouped
  key/value heads (``repeat_kv``, whenever a padding mask is passed), for attention reading
  each prompt's keys once per row, and for ``torch.multinomial`` drawing one exponential
  per vocabulary entry.
- The loss runs prompt + completion through all layers for every row, though the layers
  below the LoRA are frozen and were run on the same tokens while generating, and TRL's
  fused LM head projects every position, prompt and padding included, onto the 49k-token
  vocabulary (it skips them only with Triton, which CPUs lack).

The fast paths (CPU, one process, plain temperature/top-p sampling, Llama layers for the
recorded states; anything else runs TRL's code):

1. :func:`shared_prefill_generate`: the opening all prompts share (system prompt, rules,
   workers) runs once, then each distinct prompt's own tail; the rows decode together with
   each prompt's keys and values held once for its group, the generated ones in
   preallocated buffers, and a finished row leaves the batch. Tokens are drawn from the
   distribution transformers samples from (its temperature and top-p warpers) by the
   engine's one draw (:mod:`conductor_pipeline.generation.token_draw`), each row with its
   own generator seeded from torch's global one. The hidden states entering the first LoRA layer are recorded (:class:`FrozenStates`).
2. :func:`grouped_completion_logps`: the loss pass starts at the first LoRA layer from the
   recorded states; per group the prompt runs once with gradients (the LoRA weights act on
   its keys and values), its cache serves the group's rows, only the completion tokens run
   on top, and the LM head projects only real completion tokens.

Attention runs SDPA letting the kernel broadcast grouped key/value heads (``enable_gqa``)
instead of copying them: the same arithmetic.

Semantics versus stock TRL. Log-probabilities, entropies and LoRA gradients are the stock
ones up to float rounding (``tests/training/test_trainer_fast_path.py``). Completions follow
the same sampling distribution, EOS handling and length limit, but not the same random
stream: one seed gives other completions than stock TRL. With LoRA dropout active (training
mode, as in TRL's own generation and loss), one dropout draw covers a group's shared prompt
where stock TRL draws one per row.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper
from trl import GRPOTrainer
from trl.models.utils import unwrap_model_for_generation

from conductor_pipeline.generation.attention import unwrapped_model
from conductor_pipeline.training.fast_paths import (
    FastPathUnsupported,
    FrozenStates,
    first_trainable_layer,
    group_rows,
    grouped_completion_logps,
    prompt_caches,
    shared_prefill_generate,
)
from conductor_pipeline.training.fast_paths.layers import backbone_and_head

__all__ = [
    "ConductorGRPOTrainer",
    "FrozenStates",
    "first_trainable_layer",
    "group_rows",
    "grouped_completion_logps",
    "prompt_caches",
    "shared_prefill_generate",
]


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
    """TRL's GRPOTrainer with the CPU fast paths of this module: shared-prefill generation
    (``_generate_single_turn``) and grouped scoring (``_get_per_token_logps_and_entropies``).

    Each path checks that it applies and otherwise calls TRL's method: GPU, vLLM,
    several processes, multimodal inputs, tools, gradient checkpointing, MoE auxiliary
    losses, or sampling beyond temperature and top-p all run exactly as in TRL.
    ``fast_path_calls`` counts the calls each fast path served.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fast_path_calls = {"generation": 0, "scoring": 0}
        self._frozen_states: FrozenStates | None = None  # from the last generation

    def _cpu_blocker(self) -> str | None:
        """Why the fast paths cannot run here, or ``None``."""
        if self.accelerator.device.type != "cpu":
            return "not on CPU"
        if self.accelerator.num_processes != 1:
            return "several processes"  # the unwrapped model would bypass gradient sync
        if self.use_vllm or getattr(self, "use_transformers_continuous_batching", False):
            return "vLLM or continuous batching"
        if self._is_vlm or self.tools:
            return "multimodal model or tools"
        return None

    # -- generation --

    def _sampling_settings(self, model: Any) -> tuple[float, float] | None:
        """``(temperature, top_p)`` of TRL's generation config, when the warpers transformers
        would apply are plain temperature/top-p ones and decoding stops only at EOS or the
        length limit."""
        try:
            config, _ = model._prepare_generation_config(self.generation_config)
            processors = model._get_logits_processor(generation_config=config)
        except (AttributeError, TypeError, ValueError):
            return None  # another transformers than the one this was written against
        if not config.do_sample or (config.num_beams or 1) != 1:
            return None
        if config.stop_strings or config.max_time or config.max_new_tokens is None:
            return None
        if any(type(p) not in (TemperatureLogitsWarper, TopPLogitsWarper) for p in processors):
            return None
        return config.temperature or 1.0, config.top_p or 1.0

    def _generate_single_turn(
        self,
        prompt_ids: list[list[int]],
        images: Any,
        multimodal_fields: Any,
        num_generations: int,
        has_tool_images: bool = False,
    ) -> tuple[list[list[int]], None]:
        plain = images is None and not multimodal_fields and not has_tool_images
        if plain and self._cpu_blocker() is None:
            completions = self._shared_prefill_completions(prompt_ids)
            if completions is not None:
                self.fast_path_calls["generation"] += 1
                return completions, None
        return super()._generate_single_turn(
            prompt_ids, images, multimodal_fields, num_generations, has_tool_images
        )

    def _shared_prefill_completions(self, prompt_ids: list[list[int]]) -> list[list[int]] | None:
        with (
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                generation_kwargs=self.generation_kwargs,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as model,
            torch.no_grad(),
        ):
            sampling = self._sampling_settings(model)
            if sampling is None:
                return None
            first = first_trainable_layer(model)
            record = FrozenStates(backbone_and_head(model)[0], first) if first else None
            self._frozen_states = None
            try:
                completions = shared_prefill_generate(
                    model,
                    prompt_ids,
                    max_new_tokens=self.max_completion_length,
                    eos_token_ids=self.eos_token_ids,
                    # one seed a row, from torch's global generator (seeded by the run's seed)
                    seeds=torch.randint(2**62, (len(prompt_ids),)).tolist(),
                    temperature=sampling[0],
                    top_p=sampling[1],
                    record=record,
                )
            except FastPathUnsupported:
                return None
            self._frozen_states = record
            return completions

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
                        frozen=self._frozen_states,
                    )
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
