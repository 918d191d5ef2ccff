"""A baseline in one class: its name, its settings and how it answers a question.

::

    @register
    class Cheapest(Baseline):
        \"\"\"n samples of the cheapest worker, majority vote.\"\"\"

        name = "cheapest"               # listed in evaluation.systems
        n: int = 3                      # evaluation.cheapest.n (type-checked)

        def validate(self) -> None:     # optional: checks beyond the type
            check_int(self.n, "evaluation.cheapest.n", minimum=1)

        async def answer(self, task: Task, split: str) -> QuestionResult:
            started = time.perf_counter()
            worker = self.pool.index("sim-sprout")
            replies = [await self.pool.call(worker, as_is(task.question), i) for i in range(self.n)]
            chosen, _ = majority_vote([r.text for r in replies], task.answer_format)
            answer = replies[chosen].text if chosen is not None else ""
            return await self.finish(task, split, [(worker, r) for r in replies], answer, started)

A :class:`Baseline` is a :class:`~conductor_pipeline.evaluation.registry.SystemKind` that
answers questions itself: registered, it is listed, configured and ordered like the
built-in kinds, and on each evaluation a copy of the configured instance answers the test
questions (run as a :class:`~conductor_pipeline.evaluation.systems.System`: an error is
recorded as the question's infrastructure failure) with ``ctx``, ``pool`` and ``pool_id``
set on it (``variant`` fingerprints its settings, so changing one is a new variant that
a resume does not mix with the old rows). It runs beside the Conductor (phase
``workers``) and sorts after the built-in baselines, before the oracle; set ``rank``,
``phase`` or ``needs`` as any kind does.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from conductor_pipeline.evaluation.records import QuestionResult
from conductor_pipeline.evaluation.registry import RunContext, SystemKind
from conductor_pipeline.evaluation.systems import (
    System,
    _from_calls,
    _reply_record,
    fingerprint,
    finish_result,
)
from conductor_pipeline.tasks import Task
from conductor_pipeline.workers.types import WorkerReply

__all__ = ["Baseline", "as_is"]


def as_is(question: str) -> list[dict[str, str]]:
    """The question as the one user message (what a solo worker is sent)."""
    return [{"role": "user", "content": question}]


class _Answering(System):
    """A configured baseline as the runner calls a system (``run(task, split)``; the kind's
    own ``run`` takes the evaluation's context)."""

    def __init__(self, baseline: Baseline) -> None:
        self.baseline, self.name, self.variant = baseline, baseline.name, baseline.variant

    async def answer(self, task: Task, split: str) -> QuestionResult:
        return await self.baseline.answer(task, split)


class Baseline(SystemKind):
    """Subclass with ``name``, settings fields and ``answer``; :func:`register` it.

    While it answers: ``self.ctx`` (the :class:`RunContext`: the config's ``seed``, the
    results of the kinds that ran before it), ``self.pool`` (a
    :class:`~conductor_pipeline.evaluation.systems.PoolView`: ``call``, ``index``,
    ``names``, ``prices``) and ``self.pool_id``.
    """

    rank = (7, 5)
    variant = ""
    blank = System.blank  # the question's empty result row, under this name and variant

    def settings_values(self) -> dict[str, Any]:
        """The declared settings as configured (empty for a baseline without any)."""
        if not dataclasses.is_dataclass(self):
            return {}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def systems(self, ctx: RunContext) -> list[System]:
        configured = ctx.settings(self.name) or self
        bound = copy.copy(configured)
        bound.ctx, bound.pool, bound.pool_id = ctx, ctx.pool, ctx.pool_id
        bound.variant = fingerprint(self.name, ctx.pool_id, configured.settings_values())
        return [_Answering(bound)]

    async def answer(self, task: Task, split: str) -> QuestionResult:
        """The result of one question (``self.finish`` builds it from the calls made)."""
        raise NotImplementedError(f"{type(self).__name__}.answer")

    async def finish(
        self,
        task: Task,
        split: str,
        calls: Sequence[tuple[int, WorkerReply]],
        answer: str,
        started: float,
    ) -> QuestionResult:
        """The question's result: ``calls`` (worker position, reply) counted for cost, tokens
        and failures (a failed call makes the row an infrastructure failure), ``answer``
        judged, latency since ``started`` (``time.perf_counter()``)."""
        records = [_reply_record(self.pool, worker, reply) for worker, reply in calls]
        result = _from_calls(self.blank(task, split), records, time.perf_counter() - started)
        result.n_steps = len(records)
        result.detail = {"calls": records}
        return await finish_result(result, task, answer)
