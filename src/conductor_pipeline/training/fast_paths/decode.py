"""Shared-prefill generation: sampled completions for rows grouped by prompt, each prompt's
keys and values held once for its group, finished rows leaving the batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache

from conductor_pipeline.generation.attention import grouped_attention, unwrapped_model
from conductor_pipeline.generation.kv_cache import KV, DecodeLayer
from conductor_pipeline.generation.token_draw import draw_tokens, row_generator
from conductor_pipeline.training.fast_paths.layers import (
    FastPathUnsupported,
    FrozenStates,
    backbone_and_head,
    layer_inputs,
)
from conductor_pipeline.training.fast_paths.prefill import group_rows, prompt_caches

__all__ = ["shared_prefill_generate"]

# -- generation ------------------------------------------------------------------------------


def _spans(row_groups: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(group, first row, end row)`` of each run of rows of one group."""
    spans: list[tuple[int, int, int]] = []
    for row, group in enumerate(row_groups):
        if spans and spans[-1][0] == group:
            spans[-1] = (group, spans[-1][1], row + 1)
        else:
            spans.append((group, row, row + 1))
    return spans


class _GroupedDecodeCache(Cache):
    """The decode cache of rows sorted by prompt group; ``spans`` locates each group's
    rows among the live ones (see :func:`grouped_decode_attention`)."""

    def __init__(self, caches: list[KV], row_groups: Sequence[int]) -> None:
        n_layers = len(caches[0])
        super().__init__(
            layers=[DecodeLayer([kv[i] for kv in caches], len(row_groups)) for i in range(n_layers)]
        )
        self.spans = _spans(row_groups)

    def keep(self, indices: torch.Tensor, row_groups: Sequence[int]) -> None:
        """Keep the rows at ``indices`` (unfinished ones), whose groups are ``row_groups``."""
        for layer in self.layers:
            layer.batch_select_indices(indices)
        self.spans = _spans(row_groups)


def _head_logits(head: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head on a few rows. MKL computes ``W @ h.T`` for 8 rows of SmolLM2's 49k x 576
    head in about half the time of ``F.linear`` (the same dot products)."""
    if type(head) is not torch.nn.Linear:
        return head(hidden)
    logits = (head.weight @ hidden.T).T
    return logits if head.bias is None else logits + head.bias


@torch.no_grad()
def shared_prefill_generate(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    seeds: Sequence[int],
    temperature: float = 1.0,
    top_p: float = 1.0,
    share_prefix: bool = True,
    record: FrozenStates | None = None,
) -> list[list[int]]:
    """Sampled completions, one per row of ``prompt_ids`` (rows may repeat a prompt).

    Each row's completion ends with its first EOS token (any of ``eos_token_ids``, kept) or
    after ``max_new_tokens`` tokens: the token lists TRL's ``_generate_single_turn`` returns.
    Row ``i`` draws with its own generator seeded with ``seeds[i]``
    (:func:`~conductor_pipeline.generation.token_draw.draw_tokens`), so its completion does
    not depend on the other rows. Each distinct prompt is prefilled once (see
    :func:`prompt_caches`); its rows then decode together on its cache
    (:class:`_GroupedDecodeCache`), and a finished row leaves the batch. ``record`` receives
    the states entering its layer.
    """
    if not prompt_ids or min(len(p) for p in prompt_ids) < 2:
        raise FastPathUnsupported("prompts of fewer than two tokens")
    if len(seeds) != len(prompt_ids):
        raise ValueError(f"shared_prefill_generate: {len(seeds)} seeds for {len(prompt_ids)} rows")
    backbone, head = backbone_and_head(model)
    generators = [row_generator(seed) for seed in seeds]
    groups = group_rows(prompt_ids)
    live = [row for _, rows in groups for row in rows]  # rows sorted by group
    live_groups = [index for index, (_, rows) in enumerate(groups) for _ in rows]
    completions: list[list[int]] = [[] for _ in prompt_ids]
    fed: list[list[torch.Tensor]] = [[] for _ in prompt_ids]
    with grouped_attention(model) as grouped_heads:
        if not grouped_heads:
            raise FastPathUnsupported(
                f"attention {unwrapped_model(model).config._attn_implementation}"
            )
        caches = prompt_caches(
            model, [ids for ids, _ in groups], share_prefix=share_prefix, record=record
        )
        cache = _GroupedDecodeCache(caches, live_groups)
        device = caches[0][0][0].device
        tokens = torch.tensor([[prompt_ids[row][-1]] for row in live], device=device)
        positions = torch.tensor([[len(prompt_ids[row]) - 1] for row in live], device=device)
        eos = torch.tensor(list(eos_token_ids), device=device)
        with layer_inputs(backbone, record.layer if record is not None else None) as seen:
            for _ in range(max_new_tokens):
                hidden = backbone(
                    input_ids=tokens,
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                    grouped_decode=cache,
                ).last_hidden_state[:, -1]
                logits = _head_logits(head, hidden)
                chosen = draw_tokens(logits, temperature, [generators[r] for r in live], top_p)
                states = seen.pop() if seen else None
                for i, (row, token) in enumerate(zip(live, chosen.tolist(), strict=True)):
                    completions[row].append(token)
                    if states is not None:
                        fed[row].append(states[i, 0])
                done = torch.isin(chosen, eos)
                if bool(done.all()):
                    break
                if bool(done.any()):
                    keep = (~done).nonzero().squeeze(1)
                    live = [live[i] for i in keep.tolist()]
                    live_groups = [live_groups[i] for i in keep.tolist()]
                    cache.keep(keep, live_groups)
                    chosen, positions = chosen[keep], positions[keep]
                tokens = chosen.unsqueeze(1)
                positions = positions + 1
    if record is not None:
        for ids, completion, states in zip(prompt_ids, completions, fed, strict=True):
            record.rollouts[(tuple(ids), tuple(completion))] = torch.stack(states)
    return completions
