"""Conductor policy wrappers for evaluation: batching and sharing of identical samples.

Conductor generation on a CPU is the bottleneck of an evaluation. Two wrappers keep it down
without changing what the Conductor writes:

- :class:`BatchingPolicy` gathers the completions requested concurrently (by several
  questions in flight) and generates them in one batch when the policy has
  ``complete_many`` (``LocalPolicy``); every row keeps its own seed, so a text does not
  depend on its batch. Other policies (an endpoint, which batches server-side) are called
  as they are.
- :class:`SharedSamples` remembers completions by (messages, temperature, max_tokens, seed),
  so ``conductor`` and ``conductor+recursion`` share round 0, and the base policy evaluated
  under two names is sampled once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from conductor_pipeline.hashing import content_hash
from conductor_pipeline.workflow import PolicyCompletion


class BatchingPolicy:
    """``turn``: an ``asyncio.Lock`` shared by the batching wrappers of several local models
    (the Conductor and the base policy), so that one batch at a time uses the CPU instead of
    two models thrashing over its cores."""

    def __init__(
        self,
        policy: Any,
        *,
        max_batch: int = 4,
        wait_s: float = 0.2,
        turn: asyncio.Lock | None = None,
    ):
        self.policy = policy
        self.name = policy.name
        self.max_batch = max_batch
        self.wait_s = wait_s
        self.turn = turn
        self._pending: list[tuple[Any, asyncio.Future]] = []
        self._drainer: asyncio.Task | None = None
        self.batches: list[int] = []  # sizes of the batches generated, for reports and tests

    @property
    def batched(self) -> bool:
        return self.max_batch > 1 and hasattr(self.policy, "complete_many")

    async def complete(
        self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int, seed: int
    ) -> PolicyCompletion:
        if not self.batched:
            return await self.policy.complete(
                messages, temperature=temperature, max_tokens=max_tokens, seed=seed
            )
        future = asyncio.get_running_loop().create_future()
        self._pending.append(((messages, temperature, max_tokens, seed), future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(self.wait_s)  # let requests made at the same moment join
            first = self._pending[0][0]
            batch = [item for item in self._pending if item[0][1:3] == first[1:3]][: self.max_batch]
            for item in batch:
                self._pending.remove(item)
            live = [(req, fut) for req, fut in batch if not fut.cancelled()]
            if not live:
                continue
            self.batches.append(len(live))
            try:
                if self.turn is None:
                    outputs = await self._generate(live, first)
                else:
                    async with self.turn:
                        outputs = await self._generate(live, first)
            except Exception as exc:  # every waiting question sees the failure
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), output in zip(live, outputs, strict=True):
                if not fut.done():
                    fut.set_result(output)

    async def _generate(self, live: list, first: tuple) -> list[PolicyCompletion]:
        return await self.policy.complete_many(
            [req[0] for req, _ in live],
            temperature=first[1],
            max_tokens=first[2],
            seeds=[req[3] for req, _ in live],
        )


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
