"""Micro-batching of local Conductor generation: the one batcher of the API (``serving.batching``)
and of evaluation's local policies.

Served one at a time, concurrent requests queue behind each other's Conductor generation,
one row per decode step. :class:`MicroBatchingPolicy` wraps a policy that has
``complete_continuously`` (:class:`~conductor_pipeline.workflow.policy.LocalPolicy`) and
generates the Conductor samples that requests are waiting for in one batch, where a decode
step reads the weights and pays the per-operation overhead once for all rows. What that buys
depends on the hardware (docs/measurements.md, "Serving throughput", has the figures on a
small CPU):

- a sample that arrives while nothing is generating waits at most ``max_wait_ms`` for
  others to join, so that they share one prompt pass. A lone user does not wait: when the
  last batch had one row and every request in flight is already waiting (the API says how
  many are in flight, :attr:`MicroBatchingPolicy.in_flight`), the batch starts at once.
  After a batch of several rows the next one waits for the window counted from that batch's
  end: the requests that batch served are in their worker steps, and the clients behind
  them are a moment away from their next requests; starting without them would split the
  load into two half-size batches that take turns from then on;
- a batch is continuous: it opens with the oldest waiting sample and the others with the
  same temperature and token limit, up to ``max_batch``; samples with its settings that
  arrive while it generates join it between two decoding passes, up to ``max_batch`` rows
  writing at once, and each request gets its completion as soon as its own row is done. A
  request so never waits for the slowest row of a batch (one Conductor sample that rambles
  on to the token limit), nor for a whole batch to finish before its own starts. Samples
  with other settings wait for a later batch, and once one waits, no sample queued after
  it joins the running batch (:func:`take_queued`); in serving every request uses the
  server's ``conductor.sampling``, and in evaluation each system's, so this is rare;
- one batch generates at a time (the model and the CPU are shared; ``turn``, a lock shared by
  the batchers of several local models, extends that to all of them, as evaluation does for
  the Conductor and the base policy); the generation itself
  runs in another thread (the process's torch thread), so the event loop keeps answering
  other requests, probes and streams meanwhile;
- a request that is cancelled (client gone, timeout) leaves the queue, or, if its batch is
  already generating, its row's result is dropped; the other requests are not affected;
- an exception from a batch fails exactly the requests in that batch that are still
  waiting, with :class:`BatchGenerationError` naming the batch and the cause; the next
  batch runs.

What a request gets does not depend on its batch: every row samples from its own
generator seeded with the request's seed (``sample_seed`` of the orchestrator: the
configured seed, the question, the round and the attempt), exactly as evaluation's batched
generation does, so a request's text is the one it gets alone, up to the float rounding of
a padded batch (the tests find no difference on the real SmolLM2 model, rows that join a
running batch included). On longer texts that rounding does flip some tokens: on the
trained Conductor's 122 test questions at the 128-token limit, batched and alone gave the
same text 111 times, in float32 and in bfloat16 (``serving.dtype``) alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from conductor_pipeline.generation.chat import JoiningRow

Request = TypeVar("Request")


def take_queued(
    queue: list[Request],
    room: int,
    settings: Callable[[Request], Hashable],
    joining: Hashable | None = None,
    admit: Callable[[Request], bool | None] = lambda _: True,
) -> list[Request]:
    """Remove from ``queue`` (oldest first) and return the requests a continuous batch takes,
    at most ``room``; the one rule of every batcher over the engine (this module's and the
    sandbox's real worker's).

    Opening a batch (``joining`` None): the oldest request, then later ones with its
    ``settings`` (what a batch's rows must share: temperature, token limit); requests with
    other settings stay queued. Joining a running batch whose settings are ``joining``: the
    requests with those settings queued before the first one with other settings. That one
    opens the next batch; were joiners behind it admitted, a steady stream of them would
    keep it waiting for as long as the stream lasts. ``admit(request)``: ``True`` takes it,
    ``False`` leaves it queued for a later batch (it does not fit this one), ``None`` drops
    it (cancelled while it waited).
    """
    key = joining
    taken: list[Request] = []
    i = 0
    while i < len(queue) and len(taken) < room:
        request = queue[i]
        if key is not None and settings(request) != key:
            if joining is not None:
                break
            i += 1
            continue
        verdict = admit(request)
        if verdict is False:
            i += 1
            continue
        del queue[i]
        if verdict:
            taken.append(request)
            key = settings(request)
    return taken


@dataclass(frozen=True)
class BatchWindow:
    """How a batch gathers: ``max_batch`` samples at most, the first one waiting at most
    ``max_wait_ms`` for others (serving's ``BatchingSettings`` has the same two fields)."""

    max_batch: int = 16
    max_wait_ms: float = 200.0


class BatchGenerationError(RuntimeError):
    """The batched Conductor generation that a request was part of failed."""


@dataclass(eq=False)
class _Waiting:
    key: tuple[float, int]  # (temperature, max_tokens): what a batch must share
    messages: list[dict[str, str]]
    seed: int
    future: asyncio.Future
    arrived: float  # loop time


@dataclass
class BatchStats:
    """What the batcher has done (tests, benchmarks): ``sizes[n]`` batches of ``n`` rows."""

    sizes: Counter = field(default_factory=Counter)
    joined: int = 0  # samples that joined a batch already generating

    @property
    def batch_sizes(self) -> list[int]:
        """The size of every batch started, smallest first (joining samples not counted)."""
        return sorted(self.sizes.elements())

    @property
    def batches(self) -> int:
        return sum(self.sizes.values())

    @property
    def rows(self) -> int:
        return sum(n * count for n, count in self.sizes.items()) + self.joined


class MicroBatchingPolicy:
    """``policy`` (with ``complete_continuously``) behind a micro-batcher; see the module docstring.

    It is a Conductor policy itself (``name``, ``complete``) and passes ``load`` and
    ``warm_up`` through, so the API treats it as the policy it wraps. Bound to the event
    loop of its first request; a new loop (tests) starts with an empty queue.

    ``in_flight`` (set by the server: its count of admitted requests) ends the window once
    that many samples wait, while the last batch had one row; ``None``: the window always
    runs its course. ``settings``: a :class:`BatchWindow` or anything with its fields;
    ``turn``: see the module docstring.
    """

    def __init__(self, policy: Any, settings: Any = None, *, turn: asyncio.Lock | None = None):
        if not callable(getattr(policy, "complete_continuously", None)):
            raise ValueError(
                f"MicroBatchingPolicy: {getattr(policy, 'name', policy)!r} "
                "has no complete_continuously"
            )
        settings = settings or BatchWindow()
        self.turn = turn
        self.policy = policy
        self.name: str = policy.name
        self.max_batch = settings.max_batch
        self.max_wait_s = settings.max_wait_ms / 1000
        self.stats = BatchStats()
        self._queue: list[_Waiting] = []
        # the queue is also read by a continuous batch's generation thread (``more``)
        self._queue_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._drainer: asyncio.Task | None = None
        self.in_flight: Callable[[], int] | None = None
        self._last_rows = 0  # rows of the last batch: after several, expect more to come
        self._last_end = float("-inf")  # loop time at which it ended

    def __repr__(self) -> str:
        return f"MicroBatchingPolicy({self.policy!r}, max_batch={self.max_batch})"

    def load(self) -> None:
        loader = getattr(self.policy, "load", None)
        if callable(loader):
            loader()

    @property
    def warm_up(self) -> Any:
        """The wrapped policy's ``warm_up`` (None when it has none): the warm-up is one
        generation at start-up, before any request, so it needs no batching."""
        return getattr(self.policy, "warm_up", None)

    @property
    def loaded_dtype(self) -> str | None:
        """The wrapped policy's precision once loaded (a local model's), else None."""
        return getattr(self.policy, "loaded_dtype", None)

    @property
    def waiting(self) -> int:
        """Samples queued for a batch that has not started."""
        with self._queue_lock:
            return sum(not w.future.done() for w in self._queue)

    async def complete(
        self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int, seed: int
    ) -> Any:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # a queue, event and drainer belong to one loop
            self._loop, self._queue, self._wake, self._drainer = loop, [], asyncio.Event(), None
        future = loop.create_future()
        key = (float(temperature), int(max_tokens))
        with self._queue_lock:
            self._queue.append(_Waiting(key, messages, int(seed), future, loop.time()))
        self._wake.set()
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain(), name="conductor-batcher")
        # cancelling the caller cancels this future: the batcher then skips or drops its row
        return await future

    async def _drain(self) -> None:
        batch: list[_Waiting] = []
        try:
            while True:
                batch = await self._collect()
                if not batch:
                    return
                await self._generate(batch)
                self._last_end, batch = asyncio.get_running_loop().time(), []
        finally:
            # only on loop shutdown or a bug: nobody must wait for a batch that will not run
            with self._queue_lock:
                left, self._queue = self._queue, []
            for waiting in [*batch, *left]:
                if not waiting.future.done():
                    waiting.future.cancel()

    async def _collect(self) -> list[_Waiting]:
        """The next batch: the oldest live sample and up to ``max_batch - 1`` more with the
        same settings, once the group is full or the oldest has waited ``max_wait_s``."""
        loop = asyncio.get_running_loop()
        while True:
            with self._queue_lock:
                self._queue = [w for w in self._queue if not w.future.done()]
                if not self._queue:
                    return []
                first = self._queue[0]
                group = [w for w in self._queue if w.key == first.key][: self.max_batch]
                opened = (
                    first.arrived if self._last_rows <= 1 else max(first.arrived, self._last_end)
                )
                remaining = opened + self.max_wait_s - loop.time()
                if len(group) >= self.max_batch or remaining <= 0 or self._alone():
                    return take_queued(self._queue, self.max_batch, _settings)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), remaining)

    def _alone(self) -> bool:
        """Whether no other request is expected soon: every request in flight waits here
        and the last batch had a single row."""
        if self.in_flight is None or self._last_rows > 1:
            return False
        return len(self._queue) >= self.in_flight()

    async def _generate(self, batch: list[_Waiting]) -> None:
        self.stats.sizes[len(batch)] += 1
        self._last_rows = len(batch)
        if self.turn is None:
            await self._generate_continuously(batch)
            return
        async with self.turn:
            await self._generate_continuously(batch)

    async def _generate_continuously(self, batch: list[_Waiting]) -> None:
        """``batch`` as a continuous batch: samples with its settings that queue up while it
        generates join it between passes (up to ``max_batch`` rows at a time), and each
        request gets its completion as soon as its row is done."""
        loop = asyncio.get_running_loop()
        key = batch[0].key
        members = list(batch)  # every request the batch has taken, for errors
        answered: set[int] = set()  # id of each member whose row has finished
        closing = False  # the batcher is being cancelled (loop shutdown): admit no one

        def more(writing: int) -> list[JoiningRow]:
            # called by the generation thread before each pass
            free = self.max_batch - writing
            if free <= 0:
                return []
            with self._queue_lock:
                if closing:
                    return []
                group = take_queued(self._queue, free, _settings, key, _live)
                members.extend(group)
            self.stats.joined += len(group)
            return [(w, w.messages, w.seed) for w in group]

        def done(waiting: _Waiting, output: Any) -> None:
            answered.add(id(waiting))
            # a loop that has closed meanwhile has nobody left to answer
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, waiting.future, output)

        temperature, max_tokens = key
        try:
            await self.policy.complete_continuously(
                [(w, w.messages, w.seed) for w in batch],
                temperature=temperature,
                max_tokens=max_tokens,
                more=more,
                done=done,
            )
        except asyncio.CancelledError:
            # the rows already writing finish in their thread; nobody waits for them
            with self._queue_lock:
                closing = True
                left = list(members)
            for waiting in left:
                if not waiting.future.done():
                    waiting.future.cancel()
            raise
        except Exception as exc:
            _fail(members, answered, exc)
            return
        # a policy that returned without finishing a row: its request must not wait forever
        _fail(members, answered, RuntimeError("the batch ended without a reply for this row"))


def _settings(waiting: _Waiting) -> tuple[float, int]:
    return waiting.key


def _live(waiting: _Waiting) -> bool | None:
    return None if waiting.future.done() else True  # a cancelled request leaves the queue


def _settle(future: asyncio.Future, output: Any) -> None:
    if not future.done():  # a cancelled request's row is dropped
        future.set_result(output)


def _fail(batch: list[_Waiting], answered: set[int], exc: Exception) -> None:
    """Fail the requests of ``batch`` that are neither ``answered`` (by id) nor done with a
    :class:`BatchGenerationError`."""
    error = BatchGenerationError(
        f"Conductor generation failed for a batch of {len(batch)} request(s): "
        f"{type(exc).__name__}: {exc}"
    )
    error.__cause__ = exc
    for waiting in batch:
        if id(waiting) not in answered and not waiting.future.done():
            waiting.future.set_exception(error)
