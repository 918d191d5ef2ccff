"""MLflow traces of orchestrated questions, built from the core's plain records.

The core (``conductor_pipeline.workflow``) never imports MLflow; evaluation and serving call
:func:`log_orchestration_trace` with an :class:`OrchestrationResult`. One trace per question:
a root AGENT span, a CHAT_MODEL span per Conductor sample, a CHAIN span per round, and a span
per step carrying its worker, tokens, dollars, latency, cache hit and failure.
"""

from __future__ import annotations

import time
from typing import Any

from conductor_pipeline.workflow import OrchestrationResult

_NS = 1_000_000_000


def _ns(seconds: float) -> int:
    return int(seconds * _NS)


def log_orchestration_trace(
    result: OrchestrationResult,
    *,
    name: str = "conductor",
    tags: dict[str, str] | None = None,
    experiment_id: str | None = None,
) -> str:
    """Record ``result`` as an MLflow trace in the active tracking store; returns its id.

    Timings are laid out from the records (the orchestration has already happened): the
    root span ends now and lasts the measured wall time; Conductor samples and rounds follow
    one another, and steps keep their offsets inside their round, so parallel steps overlap.
    """
    import mlflow
    from mlflow.entities import SpanStatusCode

    end = time.time_ns()
    start = end - _ns(result.latency_s)
    record = result.to_dict()
    root = mlflow.start_span_no_context(
        name,
        span_type="AGENT",
        inputs={"question": result.question},
        attributes={
            "worker_calls": record["worker_calls"],
            "cost_usd": record["cost_usd"],
            "worker_tokens": record["tokens"],
            "conductor_tokens": record["conductor_tokens"],
            "format_failure": result.format_failure,
        },
        tags=tags,
        experiment_id=experiment_id,
        start_time_ns=start,
    )
    cursor = start
    calls_by_round: dict[int, list[Any]] = {}
    for call in result.conductor_calls:
        calls_by_round.setdefault(call.round, []).append(call)
    for round_record in result.rounds:
        for call in calls_by_round.get(round_record.round, []):
            span = mlflow.start_span_no_context(
                f"conductor round {call.round} sample {call.attempt}",
                span_type="CHAT_MODEL",
                parent_span=root,
                attributes={
                    "prompt_tokens": call.prompt_tokens,
                    "completion_tokens": call.completion_tokens,
                    "parse_error": call.parse_error or "",
                },
                start_time_ns=cursor,
            )
            cursor += _ns(call.latency_s)
            span.end(
                outputs={"text": call.text},
                status=SpanStatusCode.ERROR if call.parse_error else SpanStatusCode.OK,
                end_time_ns=cursor,
            )
        execution = round_record.execution
        if execution is None:
            continue
        round_span = mlflow.start_span_no_context(
            f"workflow round {round_record.round}",
            span_type="CHAIN",
            parent_span=root,
            inputs={"steps": len(execution.steps)},
            attributes={"stopped_by": execution.stopped_by or "", "cost_usd": execution.cost_usd},
            start_time_ns=cursor,
        )
        for step in execution.steps:
            begin = cursor + _ns(step.started_at or 0.0)
            span = mlflow.start_span_no_context(
                f"step {step.index}: {step.worker_name or step.worker}",
                span_type="LLM",
                parent_span=round_span,
                inputs={"subtask": step.subtask, "access": list(step.access)},
                attributes={
                    "worker": step.worker_name or str(step.worker),
                    "prompt_tokens": step.prompt_tokens,
                    "completion_tokens": step.completion_tokens,
                    "cost_usd": step.cost_usd,
                    "latency_s": step.latency_s,
                    "cache_hit": step.cache_hit,
                    "failure": step.failure or step.skipped_reason or "",
                },
                start_time_ns=begin,
            )
            failed = bool(step.failure or step.skipped_reason)
            span.end(
                outputs={"response": step.response},
                status=SpanStatusCode.ERROR if failed else SpanStatusCode.OK,
                end_time_ns=begin + _ns(step.latency_s),
            )
        cursor += _ns(execution.latency_s)
        round_span.end(outputs={"answer": execution.answer}, end_time_ns=cursor)
    root.end(
        outputs={"answer": result.answer},
        status=SpanStatusCode.ERROR if result.format_failure else SpanStatusCode.OK,
        end_time_ns=max(end, cursor),
    )
    return root.trace_id
