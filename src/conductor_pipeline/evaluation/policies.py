"""Conductor policy wrappers for evaluation: batching and sharing of identical samples.

Conductor generation on a CPU is the bottleneck of an evaluation. Two wrappers keep it down
without changing what the Conductor writes:

- :func:`batching_policy` gathers the completions requested concurrently (by several
  questions in flight) into one continuous batch when the policy has
  ``complete_continuously`` (``LocalPolicy``), with the engine's micro-batcher, the one the
  API uses; every row keeps its own seed, so a text does not depend on its batch. Other
  policies (an endpoint, which batches server-side) are called as they are.
- :class:`SharedSamples` remembers completions by (messages, temperature, max_tokens, seed),
  so ``conductor`` and ``conductor+recursion`` share round 0, and the base policy evaluated
  under two names is sampled once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from conductor_pipeline.generation.batching import BatchStats, BatchWindow, MicroBatchingPolicy
from conductor_pipeline.hashing import content_hash
from conductor_pipeline.workflow import PolicyCompletion


def batching_policy(
    policy: Any, *, max_batch: int = 4, wait_s: float = 0.2, turn: asyncio.Lock | None = None
) -> Any:
    """``policy`` behind the engine's micro-batcher when it can generate several samples at
    once and ``max_batch > 1``; otherwise ``policy`` itself. ``turn``: an ``asyncio.Lock``
    shared by the batchers of several local models (the Conductor and the base policy), so
    that one batch at a time uses the CPU instead of two models thrashing over its cores."""
    if max_batch <= 1 or not callable(getattr(policy, "complete_continuously", None)):
        return policy
    window = BatchWindow(max_batch=max_batch, max_wait_ms=wait_s * 1000)
    return MicroBatchingPolicy(policy, window, turn=turn)


def batch_stats(policy: Any) -> BatchStats:
    """What a :func:`batching_policy` generated: the rows each batch started with, and the
    rows that joined batches already writing (nothing when unbatched)."""
    stats = getattr(policy, "stats", None)
    return stats if isinstance(stats, BatchStats) else BatchStats()


class SharedSamples:
    def __init__(self, policy: Any):
        self.policy = policy
        self.name = policy.name
        self._samples: dict[str, asyncio.Future] = {}
        self.hits = 0

    async def complete(
        self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int, seed: int
    ) -> PolicyCompletion:
        key = content_hash([messages, temperature, max_tokens, seed], length=64)
        future = self._samples.get(key)
        if future is not None and not (
            future.done() and (future.cancelled() or future.exception() is not None)
        ):
            self.hits += 1
            return await asyncio.shield(future)
        future = asyncio.get_running_loop().create_future()
        self._samples[key] = future
        try:
            completion = await self.policy.complete(
                messages, temperature=temperature, max_tokens=max_tokens, seed=seed
            )
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a failed sample is retried by the next caller
            raise
        future.set_result(completion)
        return completion
