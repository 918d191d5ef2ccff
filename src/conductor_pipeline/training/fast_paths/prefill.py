"""Prompt prefill for the fast paths: distinct prompts run once, the opening they all share
runs once, and their keys and values serve every row that carries them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from conductor_pipeline.generation.kv_cache import KV, cache_from
from conductor_pipeline.generation.local import MIN_SHARED_PREFIX, common_prefix, layer_inputs
from conductor_pipeline.training.fast_paths.layers import (
    FastPathUnsupported,
    FrozenStates,
    backbone_and_head,
    causal_mask,
    run_layers,
)

__all__ = ["group_rows", "prompt_caches"]


# -- prompts and their caches -------------------------------------------------------------------


def group_rows(prompts: Sequence[Sequence[int]]) -> list[tuple[list[int], list[int]]]:
    """Distinct prompts in order of first appearance, each with the rows that carry it."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, ids in enumerate(prompts):
        groups.setdefault(tuple(ids), []).append(row)
    return [(list(ids), rows) for ids, rows in groups.items()]


def _run_segment(
    model: Any,
    ids: Sequence[int],
    past: KV | None,
    start: int,
    frozen: torch.Tensor | None = None,
    first: int = 0,
) -> KV:
    """Keys and values of every layer after running ``ids`` (one row, positions from
    ``start``) after ``past``; from layer ``first`` on ``frozen`` states when given."""
    backbone, _ = backbone_and_head(model)
    device = backbone.embed_tokens.weight.device
    positions = torch.arange(start, start + len(ids), device=device).unsqueeze(0)
    n_layers = backbone.config.num_hidden_layers
    if frozen is None:
        cache = backbone(
            input_ids=torch.tensor([list(ids)], device=device),
            position_ids=positions,
            past_key_values=cache_from(past, n_layers=n_layers) if past else None,
            use_cache=True,
        ).past_key_values
    else:
        cache = cache_from(past, n_layers=n_layers)
        mask = causal_mask(len(ids), start + len(ids), 1, device)
        run_layers(backbone, frozen.unsqueeze(0), positions, cache, first, mask)
    layers = cache.layers[first:]
    if any(type(layer) is not DynamicLayer for layer in layers):
        # sliding-window or linear-attention layers keep other state than keys and values
        raise FastPathUnsupported(f"cache layers {sorted({type(x).__name__ for x in layers})}")
    return [None] * first + [(layer.keys, layer.values) for layer in layers]


def prompt_caches(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    share_prefix: bool = True,
    frozen: FrozenStates | None = None,
    record: FrozenStates | None = None,
) -> list[KV | None]:
    """For each prompt, the keys and values of all its tokens but the last (the last one is
    the first input of decoding or scoring); ``None`` for a one-token prompt.

    With ``share_prefix`` the opening common to all prompts runs once and each prompt runs
    only its own tail on top of it. Gradients flow when enabled (the scoring pass).
    ``frozen``: start at its layer from its recorded states (layers below have no cache);
    ``record``: record the states entering its layer.
    """
    lengths = [len(p) - 1 for p in prompts]
    prefix = 0
    if share_prefix and len(prompts) > 1:
        prefix = common_prefix(prompts)  # at most every prompt's length but its last token
        prefix = prefix if prefix >= MIN_SHARED_PREFIX else 0
    first = frozen.layer if frozen is not None else 0
    backbone, _ = backbone_and_head(model)

    def run(ids: Sequence[int], start: int, end: int, past: KV | None) -> KV:
        states = frozen.prompts[tuple(ids)][start:end] if frozen is not None else None
        return _run_segment(model, ids[start:end], past, start, states, first)

    caches: list[KV | None] = []
    with layer_inputs(backbone, record.layer if record is not None else None) as seen:
        shared = run(prompts[0], 0, prefix, None) if prefix else None
        shared_states = seen[-1][0] if seen else None
        for ids, length in zip(prompts, lengths, strict=True):
            if length == prefix:
                caches.append(shared)
                states = shared_states
            else:
                caches.append(run(ids, prefix, length, shared))
                states = seen[-1][0] if seen else None
                if states is not None and shared_states is not None:
                    states = torch.cat([shared_states, states])
            if record is not None and states is not None:
                record.prompts[tuple(ids)] = states
    return caches
