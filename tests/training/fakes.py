"""In-process stand-ins for the worker pool, deterministic and instant."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from conductor_pipeline.tasks import Task
from conductor_pipeline.workers.types import FailureKind, Usage, WorkerReply


def make_task(i: int = 0, a: int = 2, b: int = 3, domain: str = "math") -> Task:
    return Task(
        id=f"t{i}",
        domain=domain,
        difficulty="easy",
        question=f"What is {a} + {b}?",
        answer=str(a + b),
        answer_format="number",
        verifier="numeric",
        source="test",
    )


class FakePool:
    """Workers that answer the arithmetic questions of ``make_task``.

    A worker solves a question only if the question text is in the messages it receives
    (its subtask or the steps it sees). ``good`` workers answer right, the others off by
    one. ``broken`` workers always fail with ``failure``; ``flaky`` maps a worker to how
    many of its first calls fail. Prices: 1e-6 $/prompt token, 2e-6 $/completion token.
    Usage: 10 prompt tokens and 5 completion tokens per call.
    """

    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        names: Sequence[str] = ("sim-good", "sim-bad", "sim-broken"),
        good: Sequence[int] = (0,),
        broken: Sequence[int] = (2,),
        flaky: dict[int, int] | None = None,
        failure: FailureKind = FailureKind.TIMEOUT,
        cache_hits: bool = False,
        delay_s: float = 0.0,
    ) -> None:
        self.tasks = list(tasks)
        self.names = list(names)
        self.descriptions = [f"Description of {n}: a test worker." for n in self.names]
        self.good = set(good)
        self.broken = set(broken)
        self.flaky = dict(flaky or {})
        self.failure = failure
        self.cache_hits = cache_hits
        self.delay_s = delay_s
        self.calls: Counter[int] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.prices = [(1e-6, 2e-6)] * len(self.names)

    async def __call__(
        self, worker: int, messages: list[dict[str, str]], sample_index: int = 0, **overrides
    ):
        self.calls[worker] += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            name = self.names[worker]
            text = "\n".join(m["content"] for m in messages)
            if worker in self.broken or self.calls[worker] <= self.flaky.get(worker, 0):
                return WorkerReply(name, None, Usage(), failure=self.failure, error="injected")
            usage = Usage(
                prompt_tokens=10,
                completion_tokens=5,
                cost_usd=0.0 if self.cache_hits else 10 * 1e-6 + 5 * 2e-6,
                cache_hit=self.cache_hits,
            )
            for task in self.tasks:
                if task.question in text:
                    value = int(task.answer) + (0 if worker in self.good else 1)
                    return WorkerReply(name, f"Working it out. The answer is {value}.", usage)
            return WorkerReply(name, "I cannot see any question.", usage)
        finally:
            self.in_flight -= 1


def workflow_text(workers: Sequence[int], subtasks: Sequence[str], access: Sequence[object]) -> str:
    return (
        "Some reasoning first.\n"
        f"model_id = {list(workers)}\nsubtasks = {list(subtasks)}\naccess_list = {list(access)}"
    )
