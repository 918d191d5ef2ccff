"""A local model's generation state: what a served, evaluated or asked Conductor keeps between
requests, on token ids (chat templates and text are the policy's,
:class:`~conductor_pipeline.workflow.policy.LocalPolicy`).

:class:`LocalEngine` holds the model, the key/value cache of the prompt opening that requests
share (kept by :meth:`LocalEngine.keep_opening`), the recent replies that lookup decoding
guesses from, and one lock: one generation at a time (the model is shared and CPU threads
are few). Every request, alone, batched or joining a running batch, goes through the one
decode loop, :class:`~conductor_pipeline.generation.decode.BatchLookupDecoder`.

For GRPO, a generation can also record the hidden states entering one decoder layer, row by
row (:class:`LayerStates`): the trainer's scoring passes start there instead of running the
frozen layers below the LoRA again (``training/rollouts.py``).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from conductor_pipeline.generation.decode import BatchLookupDecoder
from conductor_pipeline.generation.kv_cache import cache_from

__all__ = [
    "MIN_SHARED_PREFIX",
    "REPLY_HISTORY",
    "LayerStates",
    "LocalEngine",
    "common_prefix",
    "layer_inputs",
    "length_groups",
]

# a shared opening shorter than this is not worth a pass of its own (generation's kept
# opening and training's prompt caches alike): a pass costs about as much as a few dozen
# tokens (see length_groups)
MIN_SHARED_PREFIX = 32

# recent replies an engine keeps for lookup guesses (see LocalEngine.__init__)
REPLY_HISTORY = 32

# a row joining a continuous batch: (the caller's handle, prompt token ids, seed)
JoiningIds = tuple[Any, list[int], int]


def common_prefix(rows: Sequence[Sequence[int]], own: int = 1) -> int:
    """Tokens all rows start with, leaving every row at least ``own`` tokens of its own."""
    n = min(len(r) for r in rows) - own
    k = 0
    while k < n and all(r[k] == rows[0][k] for r in rows):
        k += 1
    return max(k, 0)


def length_groups(
    lengths: Sequence[int], max_pad_share: float = 0.1, free_pads: int = 32
) -> list[list[int]]:
    """Indices of ``lengths`` in groups of similar length, shortest first: padding a group to
    its longest row adds at most ``free_pads`` tokens or ``max_pad_share`` of the group's
    tokens, whichever is more. A pass costs about as much as a few dozen tokens on its own
    (reading the weights), so fewer pads than that are not worth one; prompts of 116 to 363
    tokens padded into one batch of 8 made a third of the prompt pass pads."""
    groups: list[list[int]] = []
    total = 0
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if groups:
            group = groups[-1]
            # ascending order: row i is the longest of its group
            tokens = total + lengths[i]
            pads = lengths[i] * (len(group) + 1) - tokens
            if pads <= max(free_pads, max_pad_share * tokens):
                group.append(i)
                total = tokens
                continue
        groups.append([i])
        total = lengths[i]
    return groups


@contextlib.contextmanager
def layer_inputs(backbone: Any, index: int | None) -> Iterator[list[torch.Tensor]]:
    """Collects the hidden states entering decoder layer ``index`` of ``backbone`` (the
    decoder stack), one tensor per call; nothing when ``index`` is ``None``."""
    seen: list[torch.Tensor] = []
    if index is None:
        yield seen
        return

    def record(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        seen.append((args[0] if args else kwargs["hidden_states"]).detach())

    handle = backbone.layers[index].register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


@dataclass
class LayerStates:
    """Hidden states entering decoder layer ``layer``, recorded while generating (GRPO's
    scoring starts there: the layers below are frozen). By row handle: ``prompt[handle]``,
    the states of the row's prompt tokens; ``fed[handle]``, those of the tokens fed while
    decoding, in order (each drawn token but the last)."""

    layer: int
    prompt: dict[Any, torch.Tensor] = field(default_factory=dict)
    fed: dict[Any, list[torch.Tensor]] = field(default_factory=dict)
    opening: torch.Tensor | None = None  # the kept opening's, when computed while recording


class LocalEngine:
    """Generation for a loaded causal LM (see the module docstring). ``generate`` and
    ``generate_continuously`` take prompts as token ids and return each row's new ids, the
    end token included when written. Counters (observability, tests): ``prefix_hits``
    (prompt passes that started from the kept opening), ``forward_passes`` (every pass,
    prompts included)."""

    def __init__(
        self,
        model: Any,
        eos_token_id: int | Collection[int],
        pad_token_id: int,
        reply_history: int = REPLY_HISTORY,
    ) -> None:
        self.model, self.eos_token_id, self.pad_token_id = model, eos_token_id, pad_token_id
        # (token ids, their keys and values per layer)
        self.prefix: tuple[tuple[int, ...], list[tuple[Any, Any]]] | None = None
        self.lock = threading.Lock()
        self.prefix_hits = self.forward_passes = 0
        # the ``reply_history`` latest replies (token ids), which lookup decoding guesses
        # from besides the request's own tokens. They change how fast a reply is written and,
        # by rounding alone, what it says: a pass that checks guesses sums in another order
        # than one-token passes, rarely enough to flip a token in float32, more often in
        # bfloat16. 0 keeps a request's text independent of the requests before it.
        self.recent_replies: collections.deque[list[int]] = collections.deque(maxlen=reply_history)
        self._draw_pool: Executor | None = None
        # while a recording generation runs: where its states go, and the layer hook's
        # states, one tensor per model call
        self._record: LayerStates | None = None
        self._seen: list[torch.Tensor] = []

    @property
    def dtype_name(self) -> str:
        """The model's precision, as settings and ``/health`` name it (``float32``, ...)."""
        return str(self.model.dtype).removeprefix("torch.")

    @classmethod
    def for_tokenizer(
        cls, model: Any, tokenizer: Any, reply_history: int = REPLY_HISTORY
    ) -> LocalEngine:
        """An engine on ``model`` with ``tokenizer``'s end token, padding with it when the
        tokenizer has no pad token."""
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        return cls(model, eos, eos if pad is None else pad, reply_history)

    def keep_opening(self, rows: list[list[int]]) -> int:
        """Compute and keep the cache of the opening ``rows`` share (when long enough);
        returns its length (0: none kept)."""
        shared = common_prefix(rows) if len(rows) > 1 else 0
        if shared < MIN_SHARED_PREFIX:
            return 0
        with self.lock, torch.inference_mode():
            self.prefix_cache(rows[0][:shared], 1)
        return shared

    def generate(
        self,
        rows: list[list[int]],
        temperature: float,
        max_tokens: int,
        seeds: Sequence[int],
        max_guess: int,
        draw_threads: Executor | None = None,
        top_p: float = 1.0,
        record: LayerStates | None = None,
    ) -> list[list[int]]:
        """Up to ``max_tokens`` new ids per row of ``rows`` (one batch; a row draws with its
        own generator seeded with its seed, so its ids do not depend on the batch; rows may
        repeat a prompt). ``record``: receives the states entering its layer, by row index
        (plain decoding only: ``max_guess=0``)."""
        replies: list[list[int]] = [[] for _ in rows]

        def done(handle: int, tokens: list[int], joined: float) -> None:
            replies[handle] = tokens

        first = [(j, ids, seed) for j, (ids, seed) in enumerate(zip(rows, seeds, strict=True))]
        self.generate_continuously(
            first,
            temperature,
            max_tokens,
            lambda _: [],
            done,
            max_guess,
            draw_threads,
            top_p,
            record,
        )
        return replies

    def generate_continuously(
        self,
        first: list[JoiningIds],
        temperature: float,
        max_tokens: int,
        more: Callable[[int], list[JoiningIds]],
        done: Callable[[Any, list[int], float], None],
        max_guess: int,
        draw_threads: Executor | None = None,
        top_p: float = 1.0,
        record: LayerStates | None = None,
    ) -> None:
        """One batch that rows join (``first``, then what ``more(rows writing)`` returns
        before each pass) and leave when done: ``done(handle, new ids, joined at)`` as soon as
        a row has finished (``joined at``: ``time.perf_counter()`` when its row joined)."""
        decoder = BatchLookupDecoder(
            self.model, self.eos_token_id, self.pad_token_id, max_guess, draw_threads
        )
        joined_at: dict[Any, float] = {}
        joining = list(first)
        if record is not None and max_guess != 0:
            raise ValueError("LocalEngine: states are recorded with plain decoding (max_guess=0)")
        layer = record.layer if record is not None else None
        with (
            self.lock,
            torch.inference_mode(),
            layer_inputs(self.model.get_decoder(), layer) as seen,
        ):
            self._record, self._seen = record, seen
            try:
                while joining or decoder.rows:
                    if joining:
                        self._join(
                            decoder,
                            joining,
                            (temperature, top_p),
                            int(max_tokens),
                            joined_at,
                        )
                    if decoder.rows:
                        decoder.step()
                        if record is not None:
                            states = seen.pop()
                            states = states.reshape(-1, states.shape[-1])  # one token a row
                            for handle, state in zip(decoder.fed_keys, states, strict=True):
                                record.fed.setdefault(handle, []).append(state)
                    for handle, tokens in decoder.pop_finished():
                        if tokens:  # an empty reply (a 0-token limit) has nothing to guess from
                            self.recent_replies.appendleft(tokens)
                        done(handle, tokens, joined_at.pop(handle))
                    joining = list(more(decoder.rows))
            finally:
                self._record, self._seen = None, []
        self.forward_passes += decoder.passes + decoder.prompt_passes

    def _join(
        self,
        decoder: BatchLookupDecoder,
        joining: list[JoiningIds],
        sampling: tuple[float, float],
        max_tokens: int,
        joined_at: dict[Any, float],
    ) -> None:
        """Add ``joining`` to ``decoder`` (``sampling``: temperature and top-p), their shared
        opening from the kept cache, in groups of similar length (:func:`length_groups`): a
        prompt pass computes its pads as if they were tokens, and on a CPU a pass over one
        row's prompt is as efficient per token as a pass over several. Rows that repeat a
        prompt share its place in the pass."""
        now = time.perf_counter()
        joined_at.update((handle, now) for handle, _, _ in joining)
        distinct: dict[tuple[int, ...], list[JoiningIds]] = {}
        for row in joining:
            distinct.setdefault(tuple(row[1]), []).append(row)
        prompts, rows_of = [list(ids) for ids in distinct], list(distinct.values())
        opening = self.shared_prefix(prompts)
        for group in length_groups([len(ids) - opening for ids in prompts]):
            input_ids, attention_mask, shared = self.padded([prompts[i] for i in group])
            cache = self.prefix_cache(prompts[group[0]][:shared], len(group)) if shared else None
            rows = [(k, row) for k, i in enumerate(group) for row in rows_of[i]]
            passes = decoder.prompt_passes
            decoder.join(
                input_ids,
                attention_mask,
                cache,
                shared,
                sampling[0],
                [seed for _, (_, _, seed) in rows],
                max_tokens,
                [handle for _, (handle, _, _) in rows],
                history=list(self.recent_replies),
                top_p=sampling[1],
                prompt_of=[k for k, _ in rows],
            )
            if self._record is not None and decoder.prompt_passes > passes:
                self._record_prompts([prompts[i] for i in group], shared, rows)

    def _record_prompts(
        self, prompts: list[list[int]], shared: int, rows: list[tuple[int, JoiningIds]]
    ) -> None:
        """The states of each row's prompt tokens: the kept opening's, then its own from the
        prompt pass just run (left-padded: its own tokens are the last columns)."""
        record = self._record
        states = self._seen.pop()
        if shared and (record.opening is None or len(record.opening) < shared):
            raise RuntimeError("LocalEngine: the prompt opening was kept before recording began")
        for k, (handle, _, _) in rows:
            own = states[k, states.shape[1] - (len(prompts[k]) - shared) :]
            record.prompt[handle] = torch.cat([record.opening[:shared], own]) if shared else own

    def padded(self, rows: list[list[int]]) -> tuple[Any, Any, int]:
        """``rows`` as one padded batch ``(input_ids, attention_mask, shared)``.

        Conductor prompts share a long opening (rules, workers, examples): its keys and
        values come from a cache (:meth:`prefix_cache`), and each row holds [shared | pads |
        own tokens] with the mask skipping the pads (positions follow the mask, so they stay
        contiguous)."""
        pad = self.pad_token_id
        shared = self.shared_prefix(rows)
        width = max(len(r) for r in rows) - shared
        input_ids = torch.tensor(
            [r[:shared] + [pad] * (width - len(r) + shared) + r[shared:] for r in rows]
        )
        attention_mask = torch.tensor(
            [[1] * shared + [0] * (width - len(r) + shared) + [1] * (len(r) - shared) for r in rows]
        )
        return input_ids, attention_mask, shared

    def shared_prefix(self, rows: list[list[int]]) -> int:
        """How many leading tokens come from a cache: as much of the kept opening as every
        row starts with (when all of it, or at least ``MIN_SHARED_PREFIX`` tokens), else the
        rows' common opening when long enough (0: no cache)."""
        common = common_prefix(rows)
        if self.prefix is not None:
            kept = self.prefix[0]
            match = common_prefix([rows[0][:common], kept], own=0)
            # a kept opening that ran into the first batch's questions ("Question: What")
            # still serves the rows that share only the template's part of it
            if match == len(kept) or match >= MIN_SHARED_PREFIX:
                return match
        return common if common >= MIN_SHARED_PREFIX and len(rows) > 1 else 0

    def prefix_cache(self, prefix: list[int], batch: int) -> Any:
        """The keys and values of ``prefix`` for ``batch`` rows: views of the kept opening's
        tensors (its first columns when ``prefix`` is shorter), which no pass writes to
        (:func:`~conductor_pipeline.generation.kv_cache.cache_from`); an opening the kept one
        does not start with is computed and kept instead."""
        key = tuple(prefix)
        if self.prefix is not None and self.prefix[0][: len(key)] == key:
            self.prefix_hits += 1
        else:
            out = self.model(input_ids=torch.tensor([prefix]), use_cache=True)
            if self._record is not None:
                self._record.opening = self._seen.pop()[0]
            self.prefix = (
                key,
                [(layer.keys, layer.values) for layer in out.past_key_values.layers],
            )
        n = len(key)
        return cache_from([(k[:, :, :n], v[:, :, :n]) for k, v in self.prefix[1]], batch)

    def draw_pool(self, threads: int, initializer: Callable[[], None]) -> Executor | None:
        """Threads for a batch's rows to draw their tokens side by side (None below two
        threads). ``initializer`` runs in each: it must leave torch one thread, since an
        OpenMP team per draw thread would slow every thread."""
        if threads < 2:
            return None
        if self._draw_pool is None:
            self._draw_pool = ThreadPoolExecutor(
                threads, thread_name_prefix="conductor-draw", initializer=initializer
            )
        return self._draw_pool
