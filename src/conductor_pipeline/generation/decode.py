"""The engine's decode loop for served, evaluated and asked Conductor replies: lookup decoding
of a batch whose rows leave when they are done and which new rows can join between passes
(:class:`BatchLookupDecoder`; one request is a batch of one row).

On a CPU, a forward pass of a small model over a handful of new tokens costs little more than
a pass over one: the weights are read from memory once either way, and that read is most of
the cost. So when the next few tokens can be guessed, one pass can check the guess and keep
every position it got right. The Conductor's replies are easy to guess: the same labels,
brackets and subtask phrases recur in every reply, so a guess is the continuation of the
latest n-gram match in the reply so far, in earlier replies (``history``) or in the prompt.

What does not change: each position's token is drawn exactly once, in order, from the
model's distribution given every token before it, by the row's own generator
(:func:`~conductor_pipeline.generation.token_draw.draw_token`, one draw per position, as
plain decoding and GRPO rollouts draw). A guess only decides how many positions one pass
covers; a wrong guess costs a slightly larger pass and stays in the cache, hidden by the mask.
The text is therefore the one plain decoding writes for the same seed, up to the float
rounding of a multi-token pass.

GRPO rollouts decode here too (``training/rollouts.py``), without guesses: sampled at
temperature 1.0, a rollout strays from the replies and prompts guesses come from, and a
wider pass over 32 rows then costs more than the tokens it saves (a group of 8 rollouts on
4 prompts from the sandbox's warm start: 19-24 s with no guess, 22 s with 4, 28-30 s with 8).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from conductor_pipeline.generation.attention import PackedRows, supports_packed_rows
from conductor_pipeline.generation.kv_cache import packed_cache, stack_rows
from conductor_pipeline.generation.token_draw import draw_token, row_generator

# n-gram lengths tried for a match, longest first: a one-token match guesses too poorly to
# be worth the larger pass
NGRAM_SIZES = (4, 3, 2)


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


@dataclass(eq=False)
class _Row:
    key: Any  # the caller's name for the row
    prompt: list[int]
    temperature: float
    top_p: float
    generator: Any
    limit: int  # most tokens to write
    index: NgramIndex  # where its guesses come from
    tokens: list[int]


class BatchLookupDecoder:
    """Lookup decoding of a padded batch whose rows leave when they are done and which new
    rows can join between passes (:meth:`join`, :meth:`step`, :meth:`pop_finished`).

    Each pass feeds every live row its newest token and its own guess, packed (one sequence
    without pads, :class:`~conductor_pipeline.generation.attention.PackedRows`; padded
    to the longest guess when the model's attention cannot take packed rows); in the cache
    each row gets as many new columns as the longest, the mask hiding the pads. Each row
    then draws its positions in order with its own generator (one draw per position, as
    plain decoding) and keeps its guess while it matches. Rejected guesses and pads stay in
    the cache, hidden by the mask from then on, so a ragged batch needs no crop; positions
    follow the mask, so a row's kept tokens stay contiguous. A finished row leaves the
    batch, its keys and values with it (the batch's last row takes its place).
    ``max_guess=0`` is plain decoding, one token a pass. With ``draw_threads`` (an
    executor) the rows draw side by side: a draw runs on one core, so a 16-row batch would
    otherwise leave the other cores idle between passes.

    Rows that join are prefilled on their own pass, then stacked under the live ones, the
    narrower side padded on the left with hidden columns; when the live rows have piled up
    many columns none of them sees, each of their visible columns first moves to the right
    end, in order, and the rest are dropped.
    Attention does not depend on where a visible column sits (positions are explicit), so a
    row writes the text it writes in any batch, up to float rounding. This is what lets a
    server keep one batch running while requests come and go (continuous batching) instead
    of making a new request wait for the slowest row of the batch before it.
    """

    def __init__(
        self,
        model: Any,
        eos_token_id: int | Collection[int],
        pad_token_id: int,
        max_guess: int = 8,
        draw_threads: Executor | None = None,
    ) -> None:
        self.model = model
        self.draw_threads = draw_threads  # None: rows draw one after another
        # a row ends at the first of these it writes (a chat model may have several)
        self.eos_token_ids = frozenset(
            [eos_token_id] if isinstance(eos_token_id, int) else eos_token_id
        )
        self.pad_token_id = pad_token_id
        self.max_guess = max_guess
        self._packed = supports_packed_rows(model)  # else padded passes
        self.passes = 0  # decoding passes, prompt passes not counted
        self.prompt_passes = 0  # passes over the prompts of joining rows
        self.guessed = 0  # guessed tokens kept, all rows together
        self.fed_keys: list[Any] = []  # the rows of the last pass, in the order fed
        self._rows: list[_Row] = []
        self._done: list[_Row] = []
        self._cache: Any = None
        self._mask: Any = None  # (rows, columns): which cache columns each row sees
        self._next_position: Any = None  # (rows,): the position of each row's next token

    @property
    def rows(self) -> int:
        """Rows still writing."""
        return len(self._rows)

    def join(
        self,
        input_ids: Any,
        attention_mask: Any,
        cache: Any,
        shared: int,
        temperature: float,
        seeds: Sequence[int],
        max_new_tokens: int,
        keys: Sequence[Any],
        history: Sequence[Sequence[int]] = (),
        top_p: float = 1.0,
        prompt_of: Sequence[int] | None = None,
    ) -> None:
        """Add rows on the prompts of a padded batch whose first ``shared`` columns are in
        ``cache`` (``None``: no cache): row ``i`` writes after prompt ``prompt_of[i]`` (default:
        one row per prompt), so rows that repeat a prompt (a GRPO group) share its prompt
        pass. ``keys`` name the rows in :meth:`pop_finished`; row ``i`` draws at
        ``temperature`` (``<= 0``: greedy) and ``top_p`` from a generator seeded with
        ``seeds[i]``; ``history``: earlier replies to guess from. One pass over the prompts
        draws each row's first token. (Feeding a joining row's prompt inside the writing rows'
        passes instead, a few tokens a pass, was measured slower: the row then waits several
        passes for its first token, and every row's latency grows.)"""
        import torch

        prompt_of = list(range(input_ids.shape[0]) if prompt_of is None else prompt_of)
        if not 0 <= shared < input_ids.shape[1]:
            raise ValueError(
                f"BatchLookupDecoder.join: {shared} cached columns of {input_ids.shape[1]}"
            )
        if not len(keys) == len(seeds) == len(prompt_of):
            raise ValueError(
                f"BatchLookupDecoder.join: {len(keys)} keys, {len(seeds)} seeds, "
                f"{len(prompt_of)} rows"
            )
        prompts = [
            input_ids[i][attention_mask[i].bool()].tolist() for i in range(input_ids.shape[0])
        ]
        # one index for the rows joining together: the shared opening once, then each
        # prompt's own tokens
        sources = [*history, prompts[0], *(p[shared:] for p in prompts[1:])]
        index = NgramIndex(sources if self.max_guess > 0 else [])
        rows = [
            _Row(
                key, prompts[p], temperature, top_p, row_generator(seed), max_new_tokens, index, []
            )
            for key, p, seed in zip(keys, prompt_of, seeds, strict=True)
        ]
        if max_new_tokens < 1:
            self._done.extend(rows)
            return
        # positions follow the mask (pads take none), as generate computes them
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model.get_decoder()(
            input_ids=input_ids[:, shared:],
            attention_mask=attention_mask,
            position_ids=positions[:, shared:],
            past_key_values=cache,
            use_cache=True,
        )
        self.prompt_passes += 1
        # the head on each row's last position, as one matrix: given (rows, 1, hidden), as
        # the model's own head would be, torch multiplies row by row, reading the 49k-wide
        # weight once per row (47 ms instead of 8 for 16 rows)
        logits = self.model.get_output_embeddings()(out.last_hidden_state[:, -1])
        first = self._each_row(
            lambda j: draw_token(logits[prompt_of[j]], temperature, rows[j].generator, top_p),
            len(rows),
        )
        for row, token in zip(rows, first, strict=True):
            row.tokens.append(token)
        cache = out.past_key_values
        if prompt_of != list(range(len(prompts))):  # each row its own copy of its prompt's
            where = torch.tensor(prompt_of)
            for layer in cache.layers:
                layer.keys, layer.values = layer.keys[where], layer.values[where]
            attention_mask, positions = attention_mask[where], positions[where]
        self._stack(cache, attention_mask, positions[:, -1] + 1, rows)
        self._retire()

    def step(self) -> None:
        """One pass for every live row: its newest token and its guess."""
        import torch

        if not self._rows:
            raise RuntimeError("BatchLookupDecoder.step: no row is writing")
        guesses = [
            row.index.guess(
                row.prompt + row.tokens,
                min(self.max_guess, row.limit - len(row.tokens)),
                reply_start=len(row.prompt),
            )
            for row in self._rows
        ]
        fed = [[row.tokens[-1], *g] for row, g in zip(self._rows, guesses, strict=True)]
        self.fed_keys = [row.key for row in self._rows]
        width = max(len(f) for f in fed)
        new_columns = [[1] * len(f) + [0] * (width - len(f)) for f in fed]
        base = self._mask.shape[1]
        mask = torch.cat([self._mask, torch.tensor(new_columns, dtype=self._mask.dtype)], dim=1)
        fed_at = [(j, i) for j, f in enumerate(fed) for i in range(len(f))]
        rows_at, columns_at = (torch.tensor(c) for c in zip(*fed_at, strict=True))
        if self._packed:
            # the rows' tokens as one sequence, no pads (PackedRows says why)
            packed_rows = PackedRows(rows_at, columns_at, len(fed), width)
            out = self.model.get_decoder()(
                input_ids=torch.tensor([list(itertools.chain.from_iterable(fed))]),
                attention_mask=_step_mask(mask, width),
                position_ids=(self._next_position[rows_at] + columns_at)[None],
                past_key_values=packed_cache(self._cache, packed_rows),
                use_cache=True,
                packed_rows=packed_rows,
            )
            hidden = out.last_hidden_state[0]
        else:
            inputs = [f + [self.pad_token_id] * (width - len(f)) for f in fed]
            out = self.model.get_decoder()(
                input_ids=torch.tensor(inputs),
                attention_mask=mask,
                position_ids=self._next_position[:, None] + torch.arange(width),
                past_key_values=self._cache,
                use_cache=True,
            )
            hidden = out.last_hidden_state[rows_at, columns_at]  # the fed columns, no pads
        self.passes += 1
        logits = self.model.get_output_embeddings()(hidden)  # 49k wide: fed columns only
        first_logit = [0, *itertools.accumulate(len(f) for f in fed)]

        def accept(j: int) -> tuple[int, int]:
            """Row ``j`` draws its positions in order while its guess holds; returns how
            many of the columns it was fed stay in its cache, and how many guesses held."""
            row, guess = self._rows[j], guesses[j]
            kept = 0
            for i in range(len(guess) + 1):
                token = draw_token(
                    logits[first_logit[j] + i], row.temperature, row.generator, row.top_p
                )
                row.tokens.append(token)
                if self._finished(row):
                    break
                if i == len(guess) or token != guess[i]:
                    break
                kept += 1
            return 1 + kept, kept

        for j, (columns, kept) in enumerate(self._each_row(accept, len(self._rows))):
            self.guessed += kept
            # the newest token and the right guesses keep their columns; the rest (wrong
            # guesses, pads) are hidden for good; the last token drawn comes next pass
            mask[j, base + columns :] = 0
            self._next_position[j] += columns
        self._mask = mask
        self._retire()

    def _each_row(self, work: Callable[[int], Any], rows: int) -> list[Any]:
        """``work(j)`` for every row, on the draw threads when there are several: a draw
        (softmax and cumulative sum over the whole vocabulary) runs on one core,
        and rows draw from their own generators, so they can draw side by side."""
        if self.draw_threads is None or rows < 2:
            return [work(j) for j in range(rows)]
        return list(self.draw_threads.map(work, range(rows)))

    def pop_finished(self) -> list[tuple[Any, list[int]]]:
        """``(key, tokens)`` of the rows done since the last call (the end token included
        when a row wrote one)."""
        done, self._done = self._done, []
        return [(row.key, row.tokens) for row in done]

    def _finished(self, row: _Row) -> bool:
        return row.tokens[-1] in self.eos_token_ids or len(row.tokens) >= row.limit

    def _retire(self) -> None:
        """Finished rows leave the batch, their keys and values with them: the last rows
        move into their places and the batch is cut short, which copies one row per leaver
        instead of the whole cache (a row's place in the batch changes nothing it computes)."""
        size = len(self._rows)
        leaving = [j for j, row in enumerate(self._rows) if self._finished(row)]
        if not leaving:
            return
        self._done.extend(self._rows[j] for j in leaving)
        if len(leaving) == size:
            self._rows, self._cache, self._mask, self._next_position = [], None, None, None
            return
        for j in reversed(leaving):  # from the end: a row moved in is never one leaving
            size -= 1
            if j == size:
                continue
            self._rows[j] = self._rows[size]
            for layer in self._cache.layers:
                layer.keys[j], layer.values[j] = layer.keys[size], layer.values[size]
            self._mask[j], self._next_position[j] = self._mask[size], self._next_position[size]
        del self._rows[size:]
        for layer in self._cache.layers:
            layer.keys, layer.values = layer.keys[:size], layer.values[:size]
        self._mask, self._next_position = self._mask[:size], self._next_position[:size]

    def _stack(self, cache: Any, mask: Any, next_position: Any, rows: list[_Row]) -> None:
        """Put freshly prefilled rows under the live ones (or in their place when none)."""
        import torch

        if not self._rows:
            self._cache, self._mask, self._next_position, self._rows = (
                cache,
                mask,
                next_position,
                rows,
            )
            return
        # compacting copies the whole cache: only worth it once the columns no row sees
        # (rejected guesses, pads, rows gone) would cost every pass more than the copy
        hidden = self._mask.shape[1] - int(self._mask.sum(dim=1).max())
        live_mask = _right_aligned(self._cache, self._mask) if hidden > _MAX_HIDDEN else self._mask
        new_mask = mask  # fresh from its prompt pass: hidden columns are pads only
        width = max(live_mask.shape[1], new_mask.shape[1])
        for live, new in zip(self._cache.layers, cache.layers, strict=True):
            stack_rows(live, new.keys, new.values, width)
        self._mask = _stacked(live_mask, new_mask, width)
        self._next_position = torch.cat([self._next_position, next_position])
        self._rows = [*self._rows, *rows]


# hidden cache columns a batch keeps before rows joining it make it compact its cache
_MAX_HIDDEN = 64


def _step_mask(mask: Any, width: int) -> Any:
    """The attention mask of a decoding pass, ``(rows, 1, width, columns)``: the ``width``
    new columns are the last of ``mask`` (rows, columns; 1: visible); new column ``i``
    sees the visible columns up to itself, as transformers builds it from ``mask``."""
    import torch

    rows, columns = mask.shape
    causal = torch.ones(width, columns, dtype=torch.bool).tril(columns - width)
    return mask.bool()[:, None, None, :] & causal


def _right_aligned(cache: Any, mask: Any) -> Any:
    """Move each row's visible cache columns to the right end, in order, and drop the
    columns no row sees; returns the matching mask."""
    import torch

    # a stable sort of the 0/1 mask: hidden columns first, visible ones after, in order
    order = torch.sort(mask, dim=1, stable=True).indices
    order = order[:, order.shape[1] - int(mask.sum(dim=1).max()) :]
    for layer in cache.layers:
        heads, dims = layer.keys.shape[1], layer.keys.shape[3]
        where = order[:, None, :, None].expand(-1, heads, -1, dims)
        layer.keys, layer.values = layer.keys.gather(2, where), layer.values.gather(2, where)
    return mask.gather(1, order)


def _stacked(top: Any, bottom: Any, width: int) -> Any:
    """Mask ``top``'s rows over ``bottom``'s, each right-aligned in ``width`` columns, hidden
    columns (zeros) on the left."""
    import torch
    import torch.nn.functional as F

    return torch.cat([F.pad(m, (width - m.shape[1], 0)) for m in (top, bottom)])
