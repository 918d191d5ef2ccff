"""What the Conductor API answers: the ``conductor`` record of a response, OpenAI's usage,
the completion body, stream chunks and progress events, written as strict JSON (a number
JSON cannot hold becomes null)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import Any

from fastapi.responses import JSONResponse

from conductor_pipeline.serving.models import ServedModel
from conductor_pipeline.workers.sandbox.questions import simulation_marks
from conductor_pipeline.workflow.orchestrator import OrchestrationConfig, OrchestrationResult


def conductor_record(
    result: OrchestrationResult,
    served: ServedModel,
    request_id: str,
    config: OrchestrationConfig,
    trace_id: str | None = None,
    question_check: Any = None,
) -> dict[str, Any]:
    """The ``conductor`` field of a response: what ran, what it cost, which model wrote it,
    whether simulated workers answered and (``question_check``, a ``QuestionCheck``)
    whether the sandbox knew the question."""
    record = result.to_dict()
    steps = record["workflow"]
    return {
        "request_id": request_id,
        "model": served.to_dict(),
        "steps": steps,
        "workers": sorted({s["worker_name"] or str(s["worker"]) for s in steps}),
        "cost_usd": record["cost_usd"],
        "tokens": record["tokens"],
        "conductor_tokens": record["conductor_tokens"],
        "worker_calls": record["worker_calls"],
        "infra_failures": record["infra_failures"],
        "latency_s": record["latency_s"],
        "format_failure": record["format_failure"],
        # a step skipped, a limit used up, or a recursion round not started for lack of budget
        "stopped_by": result.stopped_by,
        "rounds": [
            {
                "round": r["round"],
                "workflow_text": r["workflow_text"],
                "kept_previous": r["kept_previous"],
                "note": r["note"],
                "steps": len(r["execution"]["steps"]) if r["execution"] else 0,
                "cost_usd": r["execution"]["cost_usd"] if r["execution"] else 0.0,
                "tokens": r["execution"]["tokens"] if r["execution"] else 0,
                "stopped_by": r["execution"]["stopped_by"] if r["execution"] else None,
            }
            for r in record["rounds"]
        ],
        "conductor_calls": [
            {
                k: c[k]
                for k in (
                    "round",
                    "attempt",
                    "prompt_tokens",
                    "completion_tokens",
                    "latency_s",
                    "parse_error",
                )
            }
            for c in record["conductor_calls"]
        ],
        "budget": {
            "max_steps": config.budget.max_steps,
            "max_tokens": config.budget.max_tokens,
            "max_cost_usd": config.budget.max_cost_usd,
            "max_rounds": config.max_rounds,
        },
        "trace_id": trace_id,
        # simulated / sandbox_known_question / warning, as `conductor ask --json` writes them
        **simulation_marks(result, question_check),
    }


def usage(result: OrchestrationResult) -> dict[str, int]:
    """OpenAI-style usage: the Conductor's and the workers' tokens together."""
    prompt = sum(c.prompt_tokens for c in result.conductor_calls)
    completion = sum(c.completion_tokens for c in result.conductor_calls)
    for r in result.rounds:
        if r.execution is not None:
            prompt += r.execution.prompt_tokens
            completion += r.execution.completion_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def event_payload(kind: str, payload: Any, names: Sequence[str]) -> dict[str, Any] | None:
    """A progress event as plain data (``conductor_event`` of a stream chunk)."""

    def name(worker: int) -> str | None:
        return names[worker] if 0 <= worker < len(names) else None

    if kind == "conductor_output":
        return {
            "type": kind,
            "round": payload.round,
            "attempt": payload.attempt,
            "parsed": payload.parse_error is None,
            "parse_error": payload.parse_error,
            "completion_tokens": payload.completion_tokens,
            "latency_s": payload.latency_s,
        }
    if kind == "workflow":
        return {
            "type": kind,
            "steps": [
                {
                    "index": i,
                    "worker": s.worker,
                    "worker_name": name(s.worker),
                    "subtask": s.subtask,
                    "access": list(s.access),
                }
                for i, s in enumerate(payload.steps)
            ],
        }
    if kind == "step_started":
        return {
            "type": kind,
            "index": payload.index,
            "worker": payload.worker,
            "worker_name": payload.worker_name,
        }
    if kind in ("step_finished", "step_skipped"):
        return {
            "type": kind,
            "index": payload.index,
            "worker": payload.worker,
            "worker_name": payload.worker_name,
            "ok": payload.ok,
            "failure": payload.failure,
            "skipped_reason": payload.skipped_reason,
            "prompt_tokens": payload.prompt_tokens,
            "completion_tokens": payload.completion_tokens,
            "cost_usd": payload.cost_usd,
            "latency_s": payload.latency_s,
            "cache_hit": payload.cache_hit,
        }
    return None


def finite_json(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by null: JSON has no such numbers,
    and one in a record (a cost nobody could compute) must not break a response or stream."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


def _dumps(data: Any) -> str:
    return json.dumps(finite_json(data), default=str, allow_nan=False)


class SafeJSONResponse(JSONResponse):
    """Starlette's JSON response with non-finite numbers written as null (its own encoder
    raises on them, which would turn a finished answer into a 500)."""

    def render(self, content: Any) -> bytes:
        return super().render(finite_json(content))


def sse(data: dict[str, Any] | str) -> str:
    """One Server-Sent Event carrying ``data`` (a JSON object, or ``[DONE]``)."""
    return f"data: {data if isinstance(data, str) else _dumps(data)}\n\n"


def completion_body(
    request_id: str, model: str, served: ServedModel, result: OrchestrationResult, record: dict
) -> dict[str, Any]:
    """A non-streamed answer: ``chat.completion`` with the ``conductor`` record."""
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": served.id,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result.answer},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": usage(result),
        "conductor": record,
    }


class ChunkWriter:
    """The ``chat.completion.chunk`` objects of one stream (same id, time and model)."""

    def __init__(self, request_id: str, model: str, served: ServedModel) -> None:
        self.request_id, self.model, self.served = request_id, model, served
        self.created = int(time.time())

    def __call__(
        self, delta: dict[str, Any], finish: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.served.id,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
            **extra,
        }
