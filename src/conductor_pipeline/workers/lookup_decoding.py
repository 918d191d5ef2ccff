"""Lookup decoding: the tokens plain decoding draws, in fewer passes (one conversation:
:func:`lookup_generate`; a padded batch, each row with its own guess: :func:`lookup_decode_batch`).

On a CPU, a forward pass of a small model over a handful of new tokens costs little more than
a pass over one: the weights are read from memory once either way, and that read is most of
the cost. So when the next few tokens can be guessed, one pass can check the guess and keep
every position it got right. The Conductor's replies are easy to guess: the same labels,
brackets and subtask phrases recur in every reply, so a guess is the continuation of the
latest n-gram match in the reply so far, in earlier replies (``history``) or in the prompt.

What does not change: each position's token is drawn exactly once, in order, from the
model's distribution given every token before it, by the row's own sampler (the
:class:`~conductor_pipeline.workers.local_model.RowSampler` plain decoding uses, one draw per
position). A guess only decides how many positions one pass covers; a wrong guess costs a
slightly larger pass and is then thrown away, cache included. The text is therefore the one
``generate_chat`` writes for the same seed, up to the float rounding of a multi-token pass.
In a batch a wrong guess stays in the cache, hidden by the mask instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# n-gram lengths tried for a match, longest first: a one-token match guesses too poorly to
# be worth the larger pass
NGRAM_SIZES = (4, 3, 2)


@dataclass
class LookupResult:
    tokens: list[int]  # generated ids, the end token included when reached
    forward_passes: int  # after the prompt's pass
    guessed: int  # guessed tokens that were kept


class NgramIndex:
    """Where each n-gram of some fixed token sequences ends, for :meth:`guess`.

    Sources are given most trusted first (e.g. recent replies, then the prompt); for each
    n-gram the first source (and, within it, the latest occurrence) that has a continuation
    wins. Built once per request: O(total length) dictionary inserts.
    """

    def __init__(self, sources: Sequence[Sequence[int]]) -> None:
        self._sources = [list(s) for s in sources]
        self._where: dict[tuple[int, ...], tuple[int, int]] = {}
        for index in range(len(self._sources) - 1, -1, -1):
            source = self._sources[index]
            for n in NGRAM_SIZES:
                for end in range(n, len(source)):  # `end < len`: a continuation exists
                    self._where[tuple(source[end - n : end])] = (index, end)

    def guess(self, context: Sequence[int], limit: int, reply_start: int = 0) -> list[int]:
        """Up to ``limit`` tokens that followed the longest n-gram ending ``context``: first
        in the reply itself (``context[reply_start:]``: a reply repeats its own structure),
        then in the sources."""
        if limit <= 0:
            return []
        for n in NGRAM_SIZES:
            if len(context) <= n:
                continue
            key = tuple(context[-n:])
            # the latest earlier occurrence inside the reply (not the suffix itself)
            for end in range(len(context) - 1, max(n, reply_start + n) - 1, -1):
                if tuple(context[end - n : end]) == key:
                    return list(context[end : end + limit])
            found = self._where.get(key)
            if found is not None:
                index, end = found
                return self._sources[index][end : end + limit]
        return []


def lookup_generate(
    model: Any,
    prompt: Sequence[int],
    cache: Any,
    cached: int,
    sampler: Any,
    max_new_tokens: int,
    eos_token_id: int,
    history: Sequence[Sequence[int]] = (),
    max_guess: int = 8,
) -> LookupResult:
    """Generate up to ``max_new_tokens`` ids after ``prompt`` (one row).

    ``cache`` is a transformers cache that already holds the first ``cached`` tokens of
    ``prompt`` (``0`` and an empty cache are fine) and is extended in place. ``sampler`` is a
    one-row :class:`~conductor_pipeline.workers.local_model.RowSampler`: called once per
    position, in order, as in plain decoding. ``history``: earlier replies to guess from.
    """
    import torch

    if not 0 <= cached < len(prompt):
        raise ValueError(f"lookup_generate: {cached} cached tokens of a {len(prompt)}-token prompt")

    def draw(logits: Any) -> int:
        return int(torch.argmax(sampler(None, logits.float().unsqueeze(0))[0]))

    def forward(ids: Sequence[int]) -> Any:
        out = model(
            input_ids=torch.tensor([list(ids)]),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=len(ids) if len(ids) > 1 else 1,
        )
        return out.logits[0]

    index = NgramIndex([*history, prompt])
    context = list(prompt)
    with torch.inference_mode():
        generated = [draw(forward(prompt[cached:])[-1])]
        passes = kept_guesses = 0
        while generated[-1] != eos_token_id and len(generated) < max_new_tokens:
            limit = min(max_guess, max_new_tokens - len(generated))
            guess = index.guess(context + generated, limit, reply_start=len(prompt))
            logits = forward([generated[-1], *guess])  # the newest token and the guess
            passes += 1
            kept = 0
            for i in range(len(guess) + 1):
                token = draw(logits[i])
                generated.append(token)
                if token == eos_token_id or len(generated) >= max_new_tokens:
                    break
                if i == len(guess) or token != guess[i]:
                    break
                kept += 1
            kept_guesses += kept
            # the cache keeps the guesses that turned out right; the last token drawn has
            # no entry yet (the next pass starts with it)
            if len(guess) > kept:
                cache.crop(-(len(guess) - kept))
    return LookupResult(generated, passes, kept_guesses)


@dataclass
class BatchLookupResult:
    tokens: list[list[int]]  # per row, the end token included when reached
    forward_passes: int  # after the prompt's pass
    guessed: int  # guessed tokens that were kept, all rows together


def _draw(temperature: float, generator: Any, scores: Any) -> int:
    """One row's draw, as :class:`~conductor_pipeline.workers.local_model.RowSampler` makes
    it (the same operations, so the same token for the same generator state)."""
    import torch

    if temperature <= 0:
        return int(torch.argmax(scores))
    probs = torch.softmax(scores.float() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator)[0])


def lookup_decode_batch(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    cache: Any,
    shared: int,
    sampler: Any,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    history: Sequence[Sequence[int]] = (),
    max_guess: int = 8,
) -> BatchLookupResult:
    """Lookup decoding for a padded batch whose first ``shared`` columns are in ``cache``
    (``None``: no cache); up to ``max_new_tokens`` ids per row.

    Each pass feeds every unfinished row its newest token and its own guess, padded to the
    batch's longest guess; the mask hides the pads. Each row then draws its positions in
    order with its own generator (``sampler``: a
    :class:`~conductor_pipeline.workers.local_model.RowSampler`, one draw per position, as
    plain decoding) and keeps its guess while it matches. Rejected guesses and pads stay in
    the cache, hidden by the mask from then on, so a ragged batch needs no crop; positions
    follow the mask, so a row's kept tokens stay contiguous. A finished row leaves the batch,
    its keys and values with it. ``max_guess=0`` is plain decoding, one token a pass.
    """
    import torch

    rows = input_ids.shape[0]
    tokens: list[list[int]] = [[] for _ in range(rows)]
    if max_new_tokens < 1:
        return BatchLookupResult(tokens, 0, 0)
    prompts = [input_ids[i][attention_mask[i].bool()].tolist() for i in range(rows)]
    # one index for the batch: the shared opening once, then each row's own tokens
    sources = [*history, prompts[0], *(p[shared:] for p in prompts[1:])]
    index = NgramIndex(sources if max_guess > 0 else [])
    # positions follow the mask (pads take none), as generate computes them
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids[:, shared:],
        attention_mask=attention_mask,
        position_ids=positions[:, shared:],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    cache, mask, live = out.past_key_values, attention_mask, list(range(rows))
    temperatures, generators = list(sampler.temperatures), list(sampler.generators)
    next_position = positions[:, -1] + 1
    for j in live:
        tokens[j].append(_draw(temperatures[j], generators[j], out.logits[j, -1]))
    passes = kept_guesses = 0
    while True:
        keep = [
            j
            for j, row in enumerate(live)
            if tokens[row][-1] != eos_token_id and len(tokens[row]) < max_new_tokens
        ]
        if not keep:
            break
        if len(keep) < len(live):  # finished rows leave the batch
            picked = torch.tensor(keep)
            cache.batch_select_indices(picked)
            mask, next_position = mask[picked], next_position[picked]
            live = [live[j] for j in keep]
            temperatures = [temperatures[j] for j in keep]
            generators = [generators[j] for j in keep]
        guesses = [
            index.guess(
                prompts[row] + tokens[row],
                min(max_guess, max_new_tokens - len(tokens[row])),
                reply_start=len(prompts[row]),
            )
            for row in live
        ]
        width = 1 + max(len(g) for g in guesses)
        fed = [
            [tokens[row][-1], *g] + [pad_token_id] * (width - 1 - len(g))
            for row, g in zip(live, guesses, strict=True)
        ]
        new_columns = [[1] * (1 + len(g)) + [0] * (width - 1 - len(g)) for g in guesses]
        base = mask.shape[1]
        mask = torch.cat([mask, torch.tensor(new_columns, dtype=mask.dtype)], dim=1)
        out = model(
            input_ids=torch.tensor(fed),
            attention_mask=mask,
            position_ids=next_position[:, None] + torch.arange(width),
            past_key_values=cache,
            use_cache=True,
        )
        passes += 1
        for j, (row, guess) in enumerate(zip(live, guesses, strict=True)):
            kept = 0
            for i in range(len(guess) + 1):
                token = _draw(temperatures[j], generators[j], out.logits[j, i])
                tokens[row].append(token)
                if token == eos_token_id or len(tokens[row]) >= max_new_tokens:
                    break
                if i == len(guess) or token != guess[i]:
                    break
                kept += 1
            kept_guesses += kept
            # the newest token and the right guesses keep their columns; the rest (wrong
            # guesses, pads) are hidden for good; the last token drawn comes next pass
            mask[j, base + 1 + kept :] = 0
            next_position[j] += 1 + kept
    return BatchLookupResult(tokens, passes, kept_guesses)
