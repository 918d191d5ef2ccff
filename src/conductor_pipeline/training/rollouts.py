"""GRPO rollouts on the local generation engine: the ``rollout_func`` that
:class:`~conductor_pipeline.training.trainer.ConductorGRPOTrainer` hands to TRL's
``GRPOTrainer`` on a CPU.

TRL calls ``engine_rollouts(prompts, trainer)`` with the step's prompts, each repeated once
per rollout of its group, and expects the prompt and completion token ids back. The
completions are written by :class:`~conductor_pipeline.generation.local.LocalEngine`, the
engine that serves, evaluates and answers ``conductor ask``: the same token draw (one seeded
generator per row), the same attention and cache, the same decode loop. So a prompt and a
seed give a rollout the text they give a served request (``tests/generation/test_same_text.py``).
What the engine does for a GRPO batch: the opening the step's prompts share (rules and
workers) runs once, each distinct prompt runs once for all the rows of its group, then every
row decodes one token a pass (lookup guesses do not pay at temperature 1.0:
``generation/decode.py``). The model is used in the mode the trainer holds it in, as TRL's
own generation does: with LoRA dropout active, a rollout's text also depends on the dropout
draws, so the same-text guarantee holds without dropout (``training.lora.dropout: 0``).

Where the engine cannot stand in for TRL's generation (a GPU, vLLM, several processes, tools,
sampling beyond temperature and top-p), :func:`engine_rollouts_blocker` says why and the
trainer leaves TRL's own generation in place.
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["ROLLOUT_MAX_GUESS", "engine_rollouts", "engine_rollouts_blocker", "frozen_states"]

# guessed tokens a pass may check (none: see the module docstring)
ROLLOUT_MAX_GUESS = 0


def engine_rollouts_blocker(args: Any, tools: Any = None) -> str | None:
    """Why the engine cannot write this trainer's rollouts (``args``: its ``GRPOConfig``),
    or ``None`` when it can."""
    if args.use_vllm or getattr(args, "use_transformers_paged", False):
        return "vLLM or continuous batching"
    if not args.use_cpu and torch.cuda.is_available():
        return "not on CPU"
    if int(os.environ.get("WORLD_SIZE", "1")) != 1:
        return "several processes"
    if tools:
        return "tools"
    if (args.top_k or 0) > 0 or args.min_p is not None or args.repetition_penalty != 1.0:
        return "sampling beyond temperature and top-p"
    if args.generation_kwargs:
        return "generation_kwargs"
    return None


def engine_rollouts(prompts: list[Any], trainer: Any) -> dict[str, Any]:
    """TRL's ``rollout_func``: a completion for every prompt of ``prompts`` (rows repeat a
    prompt once per rollout of its group), each ending at its first end token (kept) or after
    ``max_completion_length`` tokens, as TRL's own generation ends them."""
    from trl.data_utils import is_conversational

    from conductor_pipeline.generation.attention import grouped_attention
    from conductor_pipeline.generation.local import LayerStates, LocalEngine

    if trainer.accelerator.device.type != "cpu":
        raise RuntimeError(
            f"engine_rollouts: the trainer runs on {trainer.accelerator.device}; the engine "
            "writes rollouts on a CPU only (engine_rollouts_blocker decides before training)"
        )
    tokenizer = trainer.processing_class
    if is_conversational({"prompt": prompts[0]}):
        prompt_ids = tokenizer.apply_chat_template(
            conversation=prompts,
            chat_template=trainer.chat_template,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **trainer.chat_template_kwargs,
        )["input_ids"]
    else:
        prompt_ids = tokenizer(text=prompts)["input_ids"]
    prompt_ids = [list(ids) for ids in prompt_ids]
    model = trainer.accelerator.unwrap_model(trainer.model)
    pad = tokenizer.pad_token_id
    # a fresh engine each step: the kept opening's keys and values pass through the LoRA
    # layers, which the last step changed
    engine = LocalEngine(
        model, trainer.eos_token_ids, trainer.eos_token_ids[0] if pad is None else pad
    )
    # one seed a row, from torch's global generator (seeded with the run's seed)
    seeds = torch.randint(2**62, (len(prompt_ids),)).tolist()
    layer = getattr(trainer, "frozen_layer", 0)
    record = LayerStates(layer) if layer else None
    with grouped_attention(model):
        completions = engine.generate(
            prompt_ids,
            temperature=trainer.temperature,
            max_tokens=trainer.max_completion_length,
            seeds=seeds,
            max_guess=ROLLOUT_MAX_GUESS,
            top_p=trainer.top_p,
            record=record,
        )
    if record is not None:
        trainer.frozen_states = frozen_states(record, model, prompt_ids, completions)
    trainer.fast_path_calls["generation"] += 1
    return {"prompt_ids": prompt_ids, "completion_ids": completions, "logprobs": None}


def frozen_states(
    record: Any, model: Any, prompt_ids: list[list[int]], completions: list[list[int]]
) -> Any:
    """The states ``record`` holds by row, keyed as grouped scoring looks them up: by prompt
    (all its tokens but the last) and by (prompt, completion) (the last prompt token and the
    completion but its last token, the tokens that were fed)."""
    from conductor_pipeline.training.fast_paths import FrozenStates
    from conductor_pipeline.training.fast_paths.layers import backbone_and_head

    states = FrozenStates(backbone_and_head(model)[0], record.layer)
    for row, (prompt, completion) in enumerate(zip(prompt_ids, completions, strict=True)):
        prompt_states = record.prompt[row]
        fed = [prompt_states[-1:], *(s[None] for s in record.fed.get(row, []))]
        states.prompts[tuple(prompt)] = prompt_states[:-1]
        states.rollouts[(tuple(prompt), tuple(completion))] = torch.cat(fed)[: len(completion)]
    return states
