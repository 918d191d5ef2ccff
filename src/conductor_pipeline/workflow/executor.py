"""Run a workflow against a worker pool, concurrently where the access lists allow.

Each step is an asyncio task that waits only for the steps in its access list, so steps
that do not see each other run at the same time (the paper runs every step in sequence).

Budgets bind inside a step (:mod:`.budget`). Before a step calls its worker, what finished
calls spent and what calls in flight may still spend (each reserves its prompt estimate plus
its completion cap until it finishes) are counted against the limits: ``max_steps`` counts
calls already started; with ``max_tokens`` (and ``max_cost_usd`` for workers whose prices
are known) the call is sent ``max_tokens`` = what the budget has left after the prompt
estimate, when that is below the worker's own cap. A step that would be cut short waits
while another call is in flight (its reservation may come back); with nothing in flight and
nothing left it is skipped with that budget's name, and so is every step that depends on a
skipped step. Dollars at unknown prices are checked between calls only. A provider that
counts more tokens than estimated can leave a run slightly over a limit; its reply is
recorded as it came. ``stopped_by`` names the budget that skipped a step, was used up, or
cut a reply short at its cap.

Worker failures (``reply.failure`` set, or an exception from the caller, recorded as
``provider_error``) are infrastructure failures, not wrong answers: they are recorded, and
dependants still run, seeing "(no response)" for the failed step.

In a recursion round, ``previous_round`` (see :func:`prior_steps`) is what steps written with
"all" access are shown of the round before, besides this round's earlier steps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from conductor_pipeline.workers.types import FailureKind, WorkerCaller, WorkerReply
from conductor_pipeline.workflow.budget import (
    Budget,
    BudgetLedger,
    CallPlan,
    WorkerLimits,
    caller_limits,
)
from conductor_pipeline.workflow.prompts import PriorStep, PromptConfig, worker_messages
from conductor_pipeline.workflow.types import Workflow

logger = logging.getLogger(__name__)

__all__ = [
    "Budget",
    "ExecutionResult",
    "StepRecord",
    "WorkerLimits",
    "execute_workflow",
    "prior_steps",
]

BUDGET_NAMES = ("max_steps", "max_tokens", "max_cost_usd")


@dataclass
class StepRecord:
    """What happened at one step. Times are seconds since the execution started.

    Exactly one outcome holds: ``response`` set (success), ``failure`` set (infrastructure
    failure, with ``error``), or ``skipped_reason`` set (the step never ran; the name of
    the budget that stopped it). ``completion_cap`` is the ``max_tokens`` a budget set on
    the call (``None``: the worker's own).
    """

    index: int
    worker: int
    worker_name: str | None
    subtask: str
    access: tuple[int, ...]
    response: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    cache_hit: bool = False
    failure: str | None = None
    error: str | None = None
    skipped_reason: str | None = None
    completion_cap: int | None = None
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def ok(self) -> bool:
        return self.failure is None and self.skipped_reason is None

    def to_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["access"] = list(self.access)
        row["tokens"] = self.tokens
        return row


# ``on_event(kind, step_record)``: a synchronous observer of step progress
EventCallback = Callable[[str, "StepRecord"], None]


@dataclass
class ExecutionResult:
    """The outcome of one workflow run.

    ``answer`` is the last step's response; if that step failed, was skipped or replied
    with blank text, it is the last non-empty successful response before it
    (``answer_step`` says which step; ``None`` and ``""`` when there is none).
    ``stopped_by`` names the budget that refused a step, was used up or cut a reply short,
    if any. ``latency_s`` is the
    wall-clock time of the whole run; ``calls`` counts worker calls made (including failed
    ones); ``infra_failures`` counts failed calls.
    """

    answer: str
    answer_step: int | None
    steps: list[StepRecord] = field(default_factory=list)
    stopped_by: str | None = None
    tokens: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    calls: int = 0
    latency_s: float = 0.0
    infra_failures: int = 0
    cache_hits: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "answer": self.answer,
            "answer_step": self.answer_step,
            "stopped_by": self.stopped_by,
            "tokens": self.tokens,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": self.cost_usd,
            "calls": self.calls,
            "latency_s": self.latency_s,
            "infra_failures": self.infra_failures,
            "cache_hits": self.cache_hits,
            "steps": [s.to_dict() for s in self.steps],
        }


class _Run:
    """Shared state of one execution (single event loop, so no locks needed)."""

    __slots__ = (
        "workflow",
        "question",
        "call_worker",
        "config",
        "budget",
        "names",
        "sample_index",
        "t0",
        "records",
        "responses",
        "skipped",
        "ledger",
        "released",
        "stopped_by",
        "on_event",
        "previous_round",
    )

    def __init__(
        self,
        workflow: Workflow,
        question: str,
        call_worker: WorkerCaller,
        config: PromptConfig,
        budget: Budget | None,
        names: Sequence[str] | None,
        sample_index: int,
        on_event: EventCallback | None = None,
        previous_round: Sequence[PriorStep] = (),
        worker_limits: Sequence[WorkerLimits] | None = None,
    ) -> None:
        self.on_event = on_event
        self.previous_round = tuple(previous_round)
        self.workflow = workflow
        self.question = question
        self.call_worker = call_worker
        self.config = config
        self.budget = budget
        self.names = names
        self.sample_index = sample_index
        self.t0 = time.perf_counter()
        self.records: list[StepRecord] = []
        self.responses: dict[int, str] = {}
        self.skipped: set[int] = set()
        self.ledger = BudgetLedger(budget, worker_limits)
        # set (and replaced) whenever a call finishes: steps waiting for a reservation to
        # come back wait on it
        self.released = asyncio.Event()
        self.stopped_by: str | None = None

    def emit(self, kind: str, record: StepRecord) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(kind, record)
        except Exception:  # an observer (progress printer, stream) must not break the run
            logger.exception("event callback failed on %s", kind)

    def _name(self, worker: int) -> str | None:
        names = self.names
        if names is not None and 0 <= worker < len(names):
            return names[worker]
        return None

    async def run_step(self, i: int, deps: list[asyncio.Task[None]]) -> None:
        for dep in deps:
            await dep
        step = self.workflow.steps[i]
        record = self.records[i]
        blocked = next((j for j in step.access if j in self.skipped), None)
        if blocked is not None:
            record.skipped_reason = self.records[blocked].skipped_reason
            self.skipped.add(i)
            self.emit("step_skipped", record)
            return
        messages = worker_messages(
            self.question, self.workflow, i, self.responses, self.config, self.previous_round
        )
        plan = await self._admit(step.worker, messages)
        if plan.refusal is not None:
            record.skipped_reason = plan.refusal
            self.skipped.add(i)
            if self.stopped_by is None:
                self.stopped_by = plan.refusal
            self.emit("step_skipped", record)
            return
        ledger = self.ledger
        ledger.start(plan)
        record.completion_cap = plan.max_tokens
        start = time.perf_counter()
        record.started_at = start - self.t0
        self.emit("step_started", record)
        reply: Any = None
        try:
            reply = await self._call(step.worker, messages, plan, record)
        finally:
            # the reservation goes back even when the run is cancelled mid-call
            usage = reply.usage if isinstance(reply, WorkerReply) else None
            prompt_tokens = int(usage.prompt_tokens or 0) if usage else 0
            completion_tokens = int(usage.completion_tokens or 0) if usage else 0
            cost = float(usage.cost_usd or 0.0) if usage else 0.0
            ledger.finish(plan, prompt_tokens + completion_tokens, cost, completion_tokens)
            self.released.set()
            self.released = asyncio.Event()
        end = time.perf_counter()
        record.finished_at = end - self.t0
        record.latency_s = end - start
        self._record_reply(i, record, reply)
        self.emit("step_finished", record)

    async def _admit(self, worker: int, messages: list[dict[str, str]]) -> CallPlan:
        """The budget's plan for this call, once it no longer has to wait for calls in flight."""
        while True:
            plan = self.ledger.plan(worker, messages)
            if not plan.wait:
                return plan
            await self.released.wait()

    async def _call(
        self, worker: int, messages: list[dict[str, str]], plan: CallPlan, record: StepRecord
    ) -> Any:
        # a cap only when a budget sets one, so callers without budgets are called as before
        overrides = {} if plan.max_tokens is None else {"max_tokens": plan.max_tokens}
        try:
            return await self.call_worker(worker, messages, self.sample_index, **overrides)
        except Exception as exc:  # a broken caller must not crash the run
            return WorkerReply(
                worker=record.worker_name or str(worker),
                text=None,
                failure=FailureKind.PROVIDER_ERROR,
                error=f"{type(exc).__name__}: {exc}",
            )

    def _record_reply(self, i: int, record: StepRecord, reply: Any) -> None:
        if not isinstance(reply, WorkerReply):
            record.failure = FailureKind.MALFORMED_REPLY.value
            record.error = f"the worker caller returned {type(reply).__name__}, not WorkerReply"
            return
        usage = reply.usage
        record.prompt_tokens = int(usage.prompt_tokens or 0)
        record.completion_tokens = int(usage.completion_tokens or 0)
        record.cost_usd = float(usage.cost_usd or 0.0)
        record.cache_hit = bool(usage.cache_hit)
        if record.worker_name is None and reply.worker:
            record.worker_name = reply.worker
        if reply.failure is not None:
            record.failure = str(
                reply.failure.value if hasattr(reply.failure, "value") else reply.failure
            )
            record.error = reply.error
        elif reply.text is None:
            record.failure = FailureKind.EMPTY_REPLY.value
            record.error = reply.error or "the reply has no text"
        else:
            record.response = reply.text
            self.responses[i] = reply.text


async def execute_workflow(
    workflow: Workflow,
    question: str,
    call_worker: WorkerCaller,
    *,
    config: PromptConfig | None = None,
    budget: Budget | None = None,
    worker_names: Sequence[str] | None = None,
    sample_index: int = 0,
    on_event: EventCallback | None = None,
    previous_round: Sequence[PriorStep] = (),
    worker_limits: Sequence[WorkerLimits] | None = None,
) -> ExecutionResult:
    """Execute ``workflow`` for ``question`` and collect per-step records and totals.

    ``previous_round``: in a recursion round, the steps of the round before
    (:func:`prior_steps` of its result); a step written with "all" access is shown them.

    ``on_event(kind, record)``, when given, is called synchronously with ``"step_started"``,
    ``"step_finished"`` or ``"step_skipped"`` and the step's record (progress output, streaming).

    ``call_worker`` is awaited once per step that runs, with the worker's pool position,
    the messages from :func:`worker_messages` and ``sample_index``, and ``max_tokens=``
    when a token or dollar budget caps the call. Never raises for worker problems;
    cancelling the caller's task cancels the steps in flight.

    ``worker_limits`` (each worker's own ``max_tokens`` and prices) default to what the
    pool behind ``call_worker`` configures (:func:`~.budget.caller_limits`), read only when
    the budget limits tokens or dollars.
    """
    if (
        worker_limits is None
        and budget is not None
        and (budget.max_tokens is not None or budget.max_cost_usd is not None)
    ):
        worker_limits = caller_limits(call_worker, with_prices=budget.max_cost_usd is not None)
    run = _Run(
        workflow,
        question,
        call_worker,
        config or PromptConfig(),
        budget,
        worker_names,
        sample_index,
        on_event,
        previous_round,
        worker_limits,
    )
    steps = workflow.steps
    run.records = [
        StepRecord(
            index=i,
            worker=s.worker,
            worker_name=run._name(s.worker),
            subtask=s.subtask,
            access=s.access,
        )
        for i, s in enumerate(steps)
    ]
    tasks: list[asyncio.Task[None]] = []
    try:
        for i, s in enumerate(steps):
            deps = [tasks[j] for j in s.access]
            tasks.append(asyncio.create_task(run.run_step(i, deps)))
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
    wall = time.perf_counter() - run.t0
    return _result(run, wall)


def prior_steps(result: ExecutionResult) -> list[PriorStep]:
    """The steps of a finished round as the next round's "all" steps are shown them.

    Steps a budget skipped never ran, so they are left out; a failed step is kept with
    no response, so the next round can see that it was tried.
    """
    return [
        PriorStep(r.worker, r.subtask, r.response) for r in result.steps if r.skipped_reason is None
    ]


def _result(run: _Run, wall: float) -> ExecutionResult:
    records = run.records
    answer, answer_step = "", None
    for rec in reversed(records):
        if rec.response is not None and rec.response.strip():
            answer, answer_step = rec.response, rec.index
            break
    ran = [r for r in records if r.started_at is not None]
    prompt = sum(r.prompt_tokens for r in ran)
    completion = sum(r.completion_tokens for r in ran)
    return ExecutionResult(
        answer=answer,
        answer_step=answer_step,
        steps=records,
        stopped_by=run.stopped_by or run.ledger.exhausted(),
        tokens=prompt + completion,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cost_usd=sum(r.cost_usd for r in ran),
        calls=len(ran),
        latency_s=wall,
        infra_failures=sum(1 for r in ran if r.failure is not None),
        cache_hits=sum(1 for r in ran if r.cache_hit),
    )
