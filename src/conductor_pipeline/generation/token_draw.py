"""Drawing tokens: the one draw of serving, evaluation, ``conductor ask`` and GRPO rollouts.

A token is drawn from the distribution transformers samples from (its temperature warper,
then its top-p warper, then softmax) by inverse CDF: one uniform number per row and position,
from the row's own generator, placed on the cumulative probabilities. ``torch.multinomial``
draws an exponential number per vocabulary entry instead (49,152 for SmolLM2); the inverse
CDF costs a quarter of a NumPy copy of that stream (0.085 ms a draw instead of 0.34, one
thread) and is a few lines.

Each row draws from its own generator, seeded with the row's seed (:func:`row_generator`),
once per position in order, so a row's text depends on its prompt, its seed and the
sampling settings only, never on which rows share its batch (up to float rounding).

Top-p keeps the tokens transformers' ``TopPLogitsWarper`` keeps: the likeliest ones, while the
probability of those above a token is under ``top_p``. The warper finds them by sorting the
whole vocabulary, which costs 3.3 ms a draw on one thread, forty times the rest of the draw.
A trained model's nucleus is mostly a handful of tokens, so :func:`top_p_scores` looks among
the likeliest :data:`NUCLEUS_CANDIDATES` first and sorts everything only when those hold less
than ``top_p`` of the probability: a GRPO step's rollouts took 18.3 s this way, 28.3 s with
the warper and 16.0 s without top-p (docs/measurements.md, "Training step").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "NUCLEUS_CANDIDATES",
    "draw_token",
    "draw_tokens",
    "row_generator",
    "top_p_scores",
]

# how many of the likeliest tokens top-p looks at before it sorts the whole vocabulary
NUCLEUS_CANDIDATES = 128


def row_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``: one per row, drawn from once per position."""
    return torch.Generator().manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)


def top_p_scores(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """``scores`` (rows x vocabulary) with every token outside the top-p nucleus at ``-inf``,
    as transformers' ``TopPLogitsWarper(top_p)`` leaves them."""
    from transformers.generation.logits_process import TopPLogitsWarper

    values, indices = scores.topk(min(NUCLEUS_CANDIDATES, scores.shape[-1]), dim=-1)
    probabilities = (values - scores.logsumexp(dim=-1, keepdim=True)).exp()
    cumulative = probabilities.cumsum(dim=-1)
    if bool((cumulative[:, -1] < top_p).any()):  # a nucleus reaches past the candidates
        return TopPLogitsWarper(top_p)(None, scores)
    outside = (cumulative - probabilities) >= top_p  # those above already hold top_p
    kept = values.masked_fill(outside, float("-inf"))
    return torch.full_like(scores, float("-inf")).scatter(1, indices, kept)


def draw_tokens(
    logits: torch.Tensor,
    temperature: float,
    generators: Sequence[torch.Generator],
    top_p: float = 1.0,
) -> torch.Tensor:
    """One token per row of ``logits`` (rows x vocabulary), row ``i`` drawing with
    ``generators[i]`` from ``softmax(top_p(logits / temperature))``; ``temperature <= 0``: the
    most likely token, no draw."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    if len(generators) != logits.shape[0]:
        raise ValueError(f"draw_tokens: {len(generators)} generators for {logits.shape[0]} rows")
    scores = logits.float()
    if temperature != 1.0:
        scores = scores / temperature
    if top_p < 1.0:
        scores = top_p_scores(scores, top_p)
    cdf = torch.softmax(scores, dim=-1).cumsum(dim=-1, dtype=torch.float64)
    total = cdf[:, -1:]
    uniform = torch.cat([torch.rand(1, dtype=torch.float64, generator=g) for g in generators])
    uniform = uniform.to(cdf.device)
    # strictly below the total, so the chosen token always has a positive probability
    draw = torch.minimum(uniform[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, draw, right=True).squeeze(1)


def draw_token(
    logits: torch.Tensor, temperature: float, generator: torch.Generator, top_p: float = 1.0
) -> int:
    """:func:`draw_tokens` for one row of logits (a vector)."""
    return int(draw_tokens(logits[None], temperature, [generator], top_p)[0])
