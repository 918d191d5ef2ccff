"""Lookup decoding for one conversation: the tokens plain decoding draws, in fewer passes.

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
