"""One question, end to end: ask the Conductor, parse (re-sampling on format errors), execute,
optionally let the Conductor revise in recursion rounds, and keep a record of everything.

The record is plain data (``to_dict``); tracing layers (MLflow, the API) read it, this
module imports neither.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conductor_pipeline.workers.types import WorkerCaller
from conductor_pipeline.workflow.executor import (
    Budget,
    ExecutionResult,
    execute_workflow,
    prior_steps,
)
from conductor_pipeline.workflow.parser import parse_workflow, render_workflow
from conductor_pipeline.workflow.policy import ConductorPolicy
from conductor_pipeline.workflow.prompts import PromptConfig, conductor_messages, recursion_messages
from conductor_pipeline.workflow.types import ParseLimits, Workflow, WorkflowParseError

logger = logging.getLogger(__name__)


@dataclass
class OrchestrationConfig:
    """How the Conductor is sampled and how far a question may go.

    ``max_parse_attempts``: samples drawn when the Conductor's output does not parse (the
    paper re-queries up to 5 times). ``max_rounds``: extra recursion rounds after the first
    workflow (the paper uses one). ``seed``: with the question, the round and the attempt it
    fixes each sample (:func:`sample_seed`).
    """

    temperature: float = 0.7
    max_tokens: int = 512
    max_parse_attempts: int = 5
    max_rounds: int = 0
    seed: int = 0
    prompt: PromptConfig = field(default_factory=PromptConfig)
    limits: ParseLimits = field(default_factory=ParseLimits)
    budget: Budget = field(default_factory=lambda: Budget(None, None, None))


@dataclass
class ConductorCall:
    round: int
    attempt: int
    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    parse_error: str | None = None


@dataclass
class RoundRecord:
    round: int
    workflow: Workflow | None
    execution: ExecutionResult | None
    kept_previous: bool = False
    note: str | None = None


@dataclass
class OrchestrationResult:
    question: str
    answer: str
    rounds: list[RoundRecord]
    conductor_calls: list[ConductorCall]
    format_failure: bool
    latency_s: float
    worker_names: list[str] = field(default_factory=list)
    # the budget that skipped a step, was used up, or kept a recursion round from starting
    stopped_by: str | None = None

    @property
    def final_round(self) -> RoundRecord | None:
        """The round whose workflow produced the answer (None after a format failure)."""
        for record in reversed(self.rounds):
            if record.execution is not None and not record.kept_previous:
                return record
        return None

    @property
    def worker_cost_usd(self) -> float:
        return sum(r.execution.cost_usd for r in self.rounds if r.execution)

    @property
    def worker_tokens(self) -> int:
        return sum(r.execution.tokens for r in self.rounds if r.execution)

    @property
    def conductor_tokens(self) -> int:
        return sum(c.prompt_tokens + c.completion_tokens for c in self.conductor_calls)

    @property
    def worker_calls(self) -> int:
        return sum(r.execution.calls for r in self.rounds if r.execution)

    @property
    def infra_failures(self) -> int:
        return sum(r.execution.infra_failures for r in self.rounds if r.execution)

    def to_dict(self) -> dict[str, Any]:
        """The ``conductor ask --json`` record (DESIGN.md), plus rounds and Conductor calls."""
        final = self.final_round
        steps = final.execution.to_dict()["steps"] if final and final.execution else []
        return {
            "question": self.question,
            "answer": self.answer,
            "workflow": steps,
            "cost_usd": self.worker_cost_usd,
            "tokens": self.worker_tokens,
            "conductor_tokens": self.conductor_tokens,
            "worker_calls": self.worker_calls,
            "infra_failures": self.infra_failures,
            "latency_s": self.latency_s,
            "format_failure": self.format_failure,
            "stopped_by": self.stopped_by,
            "rounds": [
                {
                    "round": r.round,
                    "workflow_text": render_workflow(r.workflow)
                    if r.workflow is not None and len(r.workflow)
                    else "",
                    "kept_previous": r.kept_previous,
                    "note": r.note,
                    "execution": r.execution.to_dict() if r.execution else None,
                }
                for r in self.rounds
            ],
            "conductor_calls": [vars(c) for c in self.conductor_calls],
        }


def _remaining(budget: Budget, spent: list[ExecutionResult]) -> Budget:
    """What is left of a per-question budget after earlier rounds."""

    def left(limit, used):
        return None if limit is None else max(limit - used, 0)

    return Budget(
        max_steps=left(budget.max_steps, sum(e.calls for e in spent)),
        max_tokens=left(budget.max_tokens, sum(e.tokens for e in spent)),
        max_cost_usd=left(budget.max_cost_usd, sum(e.cost_usd for e in spent)),
    )


def sample_seed(seed: int, question: str, round_index: int, attempt: int) -> int:
    """The sampling seed of one Conductor sample.

    The question is part of it so that questions draw independent samples: with one seed
    for every question, a sampled policy repeats the same random draws on each of them (an
    evaluation of 96 questions then measures little more than one draw). The same seed,
    question, round and attempt always give the same value, so runs are reproducible.
    """
    key = f"{seed}:{round_index}:{attempt}:{question}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big") & 0x7FFFFFFF


async def _sample_workflow(
    policy: ConductorPolicy,
    messages: list[dict[str, str]],
    n_workers: int,
    config: OrchestrationConfig,
    question: str,
    round_index: int,
    calls: list[ConductorCall],
    emit: Callable[[str, Any], None],
) -> Workflow | None:
    """Draw Conductor samples until one parses; None when every attempt failed."""
    for attempt in range(config.max_parse_attempts):
        seed = sample_seed(config.seed, question, round_index, attempt)
        completion = await policy.complete(
            messages, temperature=config.temperature, max_tokens=config.max_tokens, seed=seed
        )
        # the policy continues the prefill (if any); the workflow is read from both together
        text = config.prompt.assistant_prefill + completion.text
        call = ConductorCall(
            round_index,
            attempt,
            text,
            completion.prompt_tokens,
            completion.completion_tokens,
            completion.latency_s,
        )
        calls.append(call)
        try:
            # the parser enforces the access format the prompt offered (binary or positional)
            workflow = parse_workflow(
                text,
                n_workers,
                limits=config.limits,
                allow_empty=round_index > 0,
                positional_access=config.prompt.positional_access,
            )
        except WorkflowParseError as err:
            call.parse_error = str(err)
            emit("conductor_output", call)
            continue
        emit("conductor_output", call)
        emit("workflow", workflow)
        return workflow
    return None


def _kept(round_index: int, workflow: Workflow | None, note: str) -> RoundRecord:
    """A recursion round that ran nothing and kept the previous round's answer, and why."""
    return RoundRecord(round_index, workflow, None, kept_previous=True, note=note)


async def orchestrate(
    question: str,
    policy: ConductorPolicy,
    call_worker: WorkerCaller,
    worker_descriptions: list[str],
    *,
    worker_names: list[str] | None = None,
    config: OrchestrationConfig | None = None,
    on_event: Callable[[str, Any], None] | None = None,
) -> OrchestrationResult:
    """Answer ``question`` with a Conductor-written workflow over the given workers.

    ``on_event(kind, payload)`` observes progress as it happens: ``"conductor_output"``
    (a :class:`ConductorCall`, with ``parse_error`` set when it did not parse), ``"workflow"``
    (the parsed :class:`Workflow`), and the executor's ``"step_started"``,
    ``"step_finished"`` and ``"step_skipped"`` (a ``StepRecord``).
    """
    config = config or OrchestrationConfig()

    def emit(kind: str, payload: Any) -> None:
        if on_event is None:
            return
        try:
            on_event(kind, payload)
        except Exception:  # an observer must not break the run
            logger.exception("event callback failed on %s", kind)

    n_workers = len(worker_descriptions)
    start = time.perf_counter()
    calls: list[ConductorCall] = []
    rounds: list[RoundRecord] = []

    messages = conductor_messages(question, worker_descriptions, config.prompt)
    workflow = await _sample_workflow(policy, messages, n_workers, config, question, 0, calls, emit)
    if workflow is None:
        return OrchestrationResult(
            question,
            "",
            [RoundRecord(0, None, None, note=f"no parseable workflow in {len(calls)} attempts")],
            calls,
            True,
            time.perf_counter() - start,
            list(worker_names or []),
        )

    execution = await execute_workflow(
        workflow,
        question,
        call_worker,
        config=config.prompt,
        budget=config.budget,
        worker_names=worker_names,
        on_event=emit,
    )
    rounds.append(RoundRecord(0, workflow, execution))
    answer = execution.answer or ""
    previous_text = calls[-1].text

    stopped_by = execution.stopped_by
    for round_index in range(1, config.max_rounds + 1):
        budget = _remaining(config.budget, [r.execution for r in rounds if r.execution])
        # a limit used up, or one that already stopped a step: no room for a revision's steps,
        # so the Conductor is not asked for one
        spent = budget.refusal(0, 0, 0.0) or stopped_by
        if spent is not None:
            rounds.append(_kept(round_index, None, f"budget spent ({spent}); previous answer kept"))
            stopped_by = stopped_by or spent
            break
        messages = recursion_messages(
            question, worker_descriptions, previous_text, answer, config.prompt
        )
        revised = await _sample_workflow(
            policy, messages, n_workers, config, question, round_index, calls, emit
        )
        if revised is None:
            rounds.append(_kept(round_index, None, "no parseable revision; previous answer kept"))
            break
        if revised.is_empty:
            rounds.append(_kept(round_index, revised, "Conductor kept the previous answer"))
            break
        # "all" steps of this round also see the round before (the paper's recursion)
        before = next(r.execution for r in reversed(rounds) if r.execution is not None)
        execution = await execute_workflow(
            revised,
            question,
            call_worker,
            config=config.prompt,
            budget=budget,
            worker_names=worker_names,
            on_event=emit,
            previous_round=prior_steps(before),
        )
        rounds.append(RoundRecord(round_index, revised, execution))
        stopped_by = stopped_by or execution.stopped_by
        if execution.answer:
            answer = execution.answer
        previous_text = calls[-1].text

    return OrchestrationResult(
        question,
        answer,
        rounds,
        calls,
        False,
        time.perf_counter() - start,
        list(worker_names or []),
        stopped_by,
    )
