"""The Conductor API's endpoints, as functions of the request over one :class:`AppState`
(``request.app.state.conductor``, set by :func:`~conductor_pipeline.serving.app.create_app`).

A chat request is read and validated (``serving.schema``), checked against the key, the
policy's state and the concurrency gate, orchestrated within ``request_timeout_s``, traced,
captured when ``serving.capture`` is on, and answered as one JSON body or as a stream of
chunks (``serving.responses``). ``POST /v1/feedback`` stores a verdict, a score or a
reference answer for an earlier completion (``serving.feedback``).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse

from conductor_pipeline.serving.capture import CaptureStore, capture_record
from conductor_pipeline.serving.errors import ApiError
from conductor_pipeline.serving.feedback import FeedbackStore, parse_feedback
from conductor_pipeline.serving.middleware import Gate, GuardedStream
from conductor_pipeline.serving.models import PUBLIC_NAME
from conductor_pipeline.serving.responses import (
    ChunkWriter,
    SafeJSONResponse,
    completion_body,
    conductor_record,
    event_payload,
    sse,
    usage,
)
from conductor_pipeline.serving.schema import (
    compose_question,
    parse_request,
    read_json,
    request_config,
)
from conductor_pipeline.workflow.orchestrator import (
    OrchestrationConfig,
    OrchestrationResult,
    orchestrate,
)

if TYPE_CHECKING:
    from conductor_pipeline.serving.service import ConductorService, Probe

log = logging.getLogger(__name__)

KEEPALIVE_S = 15.0
WARNING_HEADER = "X-Conductor-Warning"


@dataclass
class AppState:
    """What the endpoints share: the service, the gate, the policy's state
    (``loading``/``ready``/``error``), the last endpoint probe (kept 2 s) and the capture
    store (off unless ``serving.capture.enabled``; then feedback is joined to it)."""

    service: ConductorService
    gate: Gate
    model_ids: frozenset[str]
    capture: CaptureStore | None = None
    started_at: int = field(default_factory=lambda: int(time.time()))
    policy: str = "loading"
    policy_error: str | None = None
    probe: tuple[float, dict[str, Any]] | None = None
    _feedback: FeedbackStore | None = None

    def feedback_store(self) -> FeedbackStore:
        """The feedback store next to the capture folder, opened at the first feedback: with
        capture off, a server that receives none creates no folder."""
        if self._feedback is None:
            if self.capture is None:
                raise ApiError(503, "feedback is not available on this server", code="no_store")
            self._feedback = FeedbackStore(self.capture)
        return self._feedback

    def describe_capture(self) -> dict[str, Any]:
        """For ``/ready`` and ``/v1/models``: capture on or off, where, the retention."""
        if self.capture is None:
            return {"enabled": False}
        return self.capture.describe()


def app_state(request: Request) -> AppState:
    return request.app.state.conductor


# --- errors -------------------------------------------------------------------------------


async def api_error(request: Request, exc: ApiError) -> JSONResponse:
    details = request.scope.get("conductor.log")
    if isinstance(details, dict):
        details["error_code"] = exc.code or exc.kind
    return SafeJSONResponse(status_code=exc.status, content=exc.body(), headers=exc.headers)


async def unexpected(request: Request, exc: Exception) -> JSONResponse:
    # the exception is logged by the server; the client learns only the request id
    request_id = request.scope.get("conductor.request_id", "?")
    error = ApiError(500, f"internal error (request {request_id})", kind="server_error")
    return SafeJSONResponse(status_code=500, content=error.body())


def authorize(state: AppState, request: Request) -> None:
    if not state.service.api_key:
        return
    given = request.headers.get("authorization")
    if not given:
        raise ApiError(
            401,
            "missing API key: send the header 'Authorization: Bearer <key>'",
            kind="authentication_error",
            code="missing_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    # the scheme is case-insensitive (RFC 9110): "bearer <key>" is accepted
    scheme, _, token = given.strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        token.strip().encode(), state.service.api_key.encode()
    ):
        raise ApiError(
            401,
            "invalid API key",
            kind="authentication_error",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )


def check_policy(state: AppState) -> None:
    if state.policy == "loading":
        raise ApiError(
            503,
            "the Conductor policy is still loading; retry shortly",
            kind="service_unavailable",
            code="loading",
            headers={"Retry-After": "5"},
        )
    if state.policy == "error":
        raise ApiError(
            503,
            "the Conductor policy failed to load; see the server log",
            kind="service_unavailable",
            code="policy_unavailable",
        )


def format_failure(result: OrchestrationResult, record: dict[str, Any]) -> ApiError:
    return ApiError(
        502,
        f"the Conductor wrote no parseable workflow in {len(result.conductor_calls)} "
        "attempt(s); no answer",
        kind="server_error",
        code="conductor_format_failure",
        extra={"conductor": record},
    )


# --- one request's work -------------------------------------------------------------------


async def run(
    state: AppState,
    question: str,
    config: OrchestrationConfig,
    on_event: Callable[[str, Any], None] | None,
) -> OrchestrationResult:
    service, timeout_s = state.service, state.service.settings.request_timeout_s
    try:
        return await asyncio.wait_for(
            orchestrate(
                question,
                service.policy,
                service.call_worker,
                service.descriptions,
                worker_names=service.worker_names,
                config=config,
                on_event=on_event,
            ),
            timeout=timeout_s,
        )
    except TimeoutError as err:
        raise ApiError(
            504,
            f"the request took longer than {timeout_s:g} s "
            "(serving.request_timeout_s) and was stopped",
            kind="timeout_error",
            code="timeout",
        ) from err


async def trace(state: AppState, result: OrchestrationResult, request_id: str) -> str | None:
    tracer = state.service.tracer
    if tracer is None:
        return None
    tags = {"request_id": request_id, "model_version": state.service.served.id, "source": "serving"}
    try:
        return await asyncio.to_thread(tracer, result, tags)
    except Exception as exc:  # tracing must never fail a request
        log.warning("MLflow trace not recorded for %s: %s", request_id, type(exc).__name__)
        return None


async def check_question(state: AppState, question: str) -> Any:
    """Whether the sandbox knows the question (None over real workers, or when the sandbox
    could not say): the answer to an unknown one is made up and is marked."""
    if state.service.question_check is None:
        return None
    try:
        return await state.service.question_check(question)
    except Exception as exc:  # a notice must never fail the request
        log.warning("question check failed: %s", type(exc).__name__)
        return None


async def capture(state: AppState, question: str, answer: str, record: dict[str, Any]) -> None:
    """Keep the request in the capture store (a no-op while capture is off). A failure is
    logged and never fails the answer: the client asked a question, not for a record."""
    store = state.capture
    if store is None or not store.enabled:
        return
    try:
        await store.append_async(capture_record(question, answer, record))
    except Exception as exc:
        log.warning("request %s not captured: %s", record.get("request_id"), type(exc).__name__)


def note(state: AppState, details: dict[str, Any], result: OrchestrationResult) -> None:
    final = result.final_round
    details.update(
        model_version=state.service.served.id,
        steps=len(final.execution.steps) if final and final.execution else 0,
        worker_calls=result.worker_calls,
        cost_usd=round(result.worker_cost_usd, 8),
        tokens=result.worker_tokens,
        conductor_tokens=result.conductor_tokens,
        format_failure=result.format_failure,
    )


# --- endpoints ----------------------------------------------------------------------------


async def health(request: Request) -> JSONResponse:
    state = app_state(request)
    if state.policy == "ready":
        return SafeJSONResponse({"status": "ok", "model": state.service.served.id})
    body = {"status": state.policy}
    if state.policy_error:
        body["detail"] = state.policy_error
    return SafeJSONResponse(status_code=503, content=body)


async def probe(state: AppState) -> dict[str, Any]:
    if state.probe and time.monotonic() - state.probe[0] < 2.0:
        return state.probe[1]
    import httpx

    async def one(p: Probe) -> bool:
        headers = {"Authorization": f"Bearer {p.api_key}"} if p.api_key else {}
        try:
            async with httpx.AsyncClient(timeout=2.0) as client:
                return (await client.get(p.url, headers=headers)).status_code < 500
        except httpx.HTTPError:
            return False

    probes = state.service.probes
    results = await asyncio.gather(*(one(p) for p in probes))
    report = {
        "probed": len(results),
        "reachable": sum(results),
        "unreachable": [p.name for p, ok in zip(probes, results, strict=True) if not ok],
    }
    state.probe = (time.monotonic(), report)
    return report


async def ready(request: Request) -> JSONResponse:
    state = app_state(request)
    endpoints = await probe(state)
    ok = state.policy == "ready" and not endpoints["unreachable"]
    return SafeJSONResponse(
        status_code=200 if ok else 503,
        content={
            "status": "ready" if ok else "not_ready",
            "policy": state.policy,
            "endpoints": endpoints,
            "in_flight": state.gate.active,
            "max_concurrency": state.gate.limit,
            "model": state.service.served.id,
            "capture": state.describe_capture(),
        },
    )


async def models(request: Request) -> dict[str, Any]:
    state = app_state(request)
    authorize(state, request)
    served = state.service.served
    entry = {
        "object": "model",
        "created": state.started_at,
        "owned_by": "conductor-pipeline",
        "version": served.version,
        "alias": served.alias,
        "served": served.id,
        "capture": state.describe_capture(),
    }
    return {"object": "list", "data": [{"id": PUBLIC_NAME, **entry}, {"id": served.id, **entry}]}


async def feedback(request: Request) -> JSONResponse:
    """``POST /v1/feedback``: a reference answer, a verdict or a score for an earlier
    completion (rules and replies: ``serving.feedback``)."""
    state = app_state(request)
    authorize(state, request)
    body = parse_feedback(await read_json(request, state.service.settings.max_body_bytes))
    details = request.scope.get("conductor.log")
    if isinstance(details, dict):
        details["feedback_kind"] = next(
            k for k in ("reference_answer", "verdict", "score") if getattr(body, k) is not None
        )
    status, reply = await state.feedback_store().submit_async(body)
    return SafeJSONResponse(status_code=status, content=reply)


async def chat_completions(request: Request) -> Any:
    state = app_state(request)
    service, settings = state.service, state.service.settings
    request_id = request.scope.get("conductor.request_id") or f"chatcmpl-{uuid.uuid4().hex[:24]}"
    details = request.scope.setdefault("conductor.log", {})
    authorize(state, request)
    body = parse_request(await read_json(request, settings.max_body_bytes), state.model_ids)
    question, context_turns = compose_question(
        body.messages, settings.max_question_chars, settings.max_context_chars
    )
    config = request_config(body, service.orchestration, settings)
    details.update(
        stream=bool(body.stream), question_chars=len(question), context_turns=context_turns
    )
    check_policy(state)
    checked = await check_question(state, question)
    warning = {WARNING_HEADER: checked.warning} if checked is not None and checked.warning else {}
    if not state.gate.try_enter():
        raise ApiError(
            429,
            f"the server is busy: {state.gate.limit} requests in flight, its limit "
            f"(serving.max_concurrency); retry after {settings.retry_after_s} s",
            kind="rate_limit_error",
            code="server_busy",
            headers={"Retry-After": str(settings.retry_after_s)},
        )
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks = ChunkWriter(request_id, body.model, service.served)
        return GuardedStream(
            stream(state, chunks, question, config, include_usage, details, checked),
            on_close=state.gate.leave,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **warning},
        )
    try:
        result = await run(state, question, config, None)
    finally:
        state.gate.leave()
    note(state, details, result)
    trace_id = await trace(state, result, request_id)
    record = conductor_record(result, service.served, request_id, config, trace_id, checked)
    if result.format_failure:
        raise format_failure(result, record)
    await capture(state, question, result.answer, record)
    return SafeJSONResponse(
        completion_body(request_id, body.model, service.served, result, record), headers=warning
    )


async def stream(
    state: AppState,
    chunk: ChunkWriter,
    question: str,
    config: OrchestrationConfig,
    include_usage: bool,
    details: dict[str, Any],
    checked: Any = None,
) -> AsyncIterator[str]:
    """The SSE body: role, progress events, the answer, the record, usage, ``[DONE]``; an
    error after the stream began is one ``{"error": ...}`` event."""
    request_id = chunk.request_id
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def on_event(kind: str, payload: Any) -> None:
        event = event_payload(kind, payload, state.service.worker_names)
        if event is not None:
            queue.put_nowait(("event", event))

    async def work() -> None:
        try:
            queue.put_nowait(("done", await run(state, question, config, on_event)))
        except ApiError as exc:
            queue.put_nowait(("error", exc))
        except Exception:
            log.exception("request %s failed", request_id)
            error = ApiError(500, f"internal error (request {request_id})", kind="server_error")
            queue.put_nowait(("error", error))

    task = asyncio.create_task(work(), name=f"conductor-{request_id}")
    try:
        yield sse(chunk({"role": "assistant", "content": ""}))
        while True:
            try:
                kind, item = await asyncio.wait_for(queue.get(), timeout=KEEPALIVE_S)
            except TimeoutError:
                yield ": keep-alive\n\n"
                continue
            if kind == "event":
                yield sse(chunk({}, conductor_event=item))
                continue
            if kind == "error":
                details["error_code"] = item.code or item.kind
                yield sse(item.body())
                break
            result: OrchestrationResult = item
            note(state, details, result)
            trace_id = await trace(state, result, request_id)
            served = state.service.served
            record = conductor_record(result, served, request_id, config, trace_id, checked)
            if result.format_failure:
                error = format_failure(result, record)
                details["error_code"] = error.code
                yield sse(error.body())
                break
            # captured before the answer goes out, so feedback sent on it finds the request
            await capture(state, question, result.answer, record)
            if result.answer:
                yield sse(chunk({"content": result.answer}))
            yield sse(chunk({}, "stop", conductor=record))
            if include_usage:
                yield sse({**chunk({}), "choices": [], "usage": usage(result)})
            break
        yield sse("[DONE]")
    finally:
        if not task.done():
            task.cancel()
