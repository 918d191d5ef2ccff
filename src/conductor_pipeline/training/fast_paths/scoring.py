"""Grouped scoring: per-token log-probabilities (and entropies) of completions, each
prompt run once for its rows; the states entering the first trainable layer are recorded by
one scoring pass and let the next passes over the same rollouts start there."""

from __future__ import annotations

from typing import Any

import torch

from conductor_pipeline.generation.attention import grouped_attention
from conductor_pipeline.generation.kv_cache import cache_from
from conductor_pipeline.generation.local import layer_inputs
from conductor_pipeline.training.fast_paths.layers import (
    FastPathUnsupported,
    FrozenStates,
    backbone_and_head,
    causal_mask,
    run_layers,
)
from conductor_pipeline.training.fast_paths.prefill import group_rows, prompt_caches

__all__ = ["grouped_completion_logps"]

# -- scoring ---------------------------------------------------------------------------------


def _token_logps(
    logits: torch.Tensor,
    targets: torch.Tensor,
    compute_entropy: bool,
    entropy_requires_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    log_probs = logits.log_softmax(dim=-1)
    logps = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not compute_entropy:
        return logps, None
    with torch.set_grad_enabled(entropy_requires_grad and torch.is_grad_enabled()):
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logps, entropy


def _usable_states(
    frozen: FrozenStates | None,
    model: Any,
    prompts: list[list[int]],
    completions: list[tuple[int, ...]],
) -> FrozenStates | None:
    """``frozen`` when it holds the states of every row of this batch for this model (the
    caller fixes ``frozen.layer`` at a layer no adapter reaches below)."""
    if frozen is None or frozen.backbone is not backbone_and_head(model)[0]:
        return None
    rows = zip(prompts, completions, strict=True)
    if any((tuple(p), c) not in frozen.rollouts for p, c in rows):
        return None
    if any(len(p) > 1 and tuple(p) not in frozen.prompts for p in prompts):
        return None
    return frozen


def grouped_completion_logps(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    entropy_requires_grad: bool = False,
    batch_size: int | None = None,
    share_prefix: bool = True,
    frozen: FrozenStates | None = None,
    record: FrozenStates | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities (and entropies) of the completion tokens, as TRL's
    ``_get_per_token_logps_and_entropies`` returns them: ``(rows, logits_to_keep)``, zero
    where ``attention_mask`` is 0.

    ``input_ids`` is TRL's layout: left-padded prompts, then right-padded completions of
    width ``logits_to_keep``. Rows are grouped by prompt (in any order); each prompt runs
    once and its cache serves its rows, ``batch_size`` rows at a time (``None``: all).
    When ``frozen`` holds every row, the layers below its layer are not run again;
    otherwise ``record`` (when given) receives the states entering its layer, for the next
    pass over these rows (a step scores its rollouts two or three times: the reference
    model, the old policy, the loss).
    """
    rows_total, split = input_ids.size(0), input_ids.size(1) - logits_to_keep
    device = input_ids.device
    prompt_mask = attention_mask[:, :split].bool()
    completion_ids = input_ids[:, split:]
    completion_mask = attention_mask[:, split:].bool()
    prompts = [
        row[keep].tolist() for row, keep in zip(input_ids[:, :split], prompt_mask, strict=True)
    ]
    if min(len(p) for p in prompts) < 1:
        raise FastPathUnsupported("a row without prompt tokens")
    completions = [
        tuple(row[keep].tolist()) for row, keep in zip(completion_ids, completion_mask, strict=True)
    ]
    backbone, head = backbone_and_head(model)
    groups = group_rows(prompts)

    order: list[int] = []
    logps_parts: list[torch.Tensor] = []
    entropy_parts: list[torch.Tensor] = []
    with grouped_attention(model) as grouped_heads:
        frozen = _usable_states(frozen, model, prompts, completions) if grouped_heads else None
        if frozen is not None:
            frozen.uses += 1
        record = record if frozen is None else None
        caches = prompt_caches(
            model,
            [ids for ids, _ in groups],
            share_prefix=share_prefix,
            frozen=frozen,
            record=record,
        )
        for (ids, group), kv in zip(groups, caches, strict=True):
            step = batch_size or len(group)
            for start in range(0, len(group), step):
                rows = group[start : start + step]
                index = torch.tensor(rows, device=device)
                targets, valid = completion_ids[index], completion_mask[index]
                # the columns up to the last real token (one at least keeps the graph connected)
                used = int(valid.any(0).nonzero().max()) + 1 if bool(valid.any()) else 1
                past = len(ids) - 1
                positions = torch.arange(past, past + used, device=device)
                positions = positions.unsqueeze(0).expand(len(rows), -1)
                cache = cache_from(kv, len(rows), backbone.config.num_hidden_layers)
                if frozen is None:
                    first = input_ids.new_full((len(rows), 1), ids[-1])
                    with layer_inputs(backbone, record.layer if record else None) as seen:
                        hidden = backbone(
                            input_ids=torch.cat([first, targets[:, : used - 1]], dim=1),
                            position_ids=positions,
                            past_key_values=cache if kv is not None else None,
                            use_cache=True,
                        ).last_hidden_state
                    if record is not None:
                        for i, r in enumerate(rows):  # the fed tokens: one per completion token
                            key = (tuple(ids), completions[r])
                            record.rollouts[key] = seen[-1][i, : len(completions[r])]
                else:
                    states = [frozen.rollouts[(tuple(ids), completions[r])] for r in rows]
                    inputs = states[0].new_zeros((len(rows), used, states[0].shape[-1]))
                    for i, row_states in enumerate(states):
                        inputs[i, : len(row_states)] = row_states[:used]
                    mask = causal_mask(used, past + used, len(rows), device)
                    hidden = run_layers(backbone, inputs, positions, cache, frozen.layer, mask)
                scored = valid[:, :used]
                logits = head(hidden[scored]).float() / temperature
                logps, entropy = _token_logps(
                    logits, targets[:, :used][scored], compute_entropy, entropy_requires_grad
                )
                full = torch.zeros_like(valid)
                full[:, :used] = scored
                logps_parts.append(logps.new_zeros(valid.shape).masked_scatter(full, logps))
                if entropy is not None:
                    entropy_parts.append(
                        entropy.new_zeros(valid.shape).masked_scatter(full, entropy)
                    )
                order.extend(rows)
    # back to the caller's row order
    inverse = torch.empty(rows_total, dtype=torch.long, device=device)
    inverse[torch.tensor(order, device=device)] = torch.arange(rows_total, device=device)
    logps = torch.cat(logps_parts)[inverse]
    entropies = torch.cat(entropy_parts)[inverse] if compute_entropy else None
    return logps, entropies
