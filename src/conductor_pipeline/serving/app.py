"""The Conductor API: an OpenAI-compatible chat endpoint answered by orchestrated workflows.

Endpoints (:func:`create_app`):

* ``POST /v1/chat/completions`` — ``model`` is ``conductor`` (or the served version's id,
  e.g. ``conductor/3``, or ``conductor@<alias>``). The last message must be the user's: it
  is the question. Earlier turns (system, user, assistant) become context: they are written
  before the question as a short transcript, one line per turn, most recent kept when
  longer than ``serving.max_context_chars``; the Conductor reads it and workers see it only
  where the Conductor (or ``question_to_workers``) passes it on. The answer is
  ``choices[0].message.content``; an extra top-level ``conductor`` field holds the executed
  workflow: steps with worker, subtask, access, tokens, cost and latency, the rounds, totals,
  the budget applied and the served model version. Over the sandbox's simulated workers,
  which know only the prepared tasks, the record's ``sandbox_known_question`` says whether
  the question is one of them; when it is not, ``simulated`` is true (the answer is made
  up), ``warning`` says so and what to do instead, and the response carries the same text
  in an ``X-Conductor-Warning`` header (streamed or not). Over real workers
  ``sandbox_known_question`` and ``warning`` are null, ``simulated`` is false and no header
  is sent.
* ``GET /v1/models`` — ``conductor`` and the served version id.
* ``GET /health`` — liveness: 200 once the policy is loaded, 503 while it loads or if loading
  failed. ``GET /ready`` — readiness: the policy is loaded and every worker endpoint answers.

Streaming (``stream: true``) is Server-Sent Events in OpenAI's chunk format. The first chunk
carries ``delta.role``; progress chunks have an empty ``delta`` and an extra top-level
``conductor_event`` (``conductor_output``, ``workflow``, ``step_started``,
``step_finished``, ``step_skipped``), so a client that reads only ``delta.content`` sees
nothing but the answer; then the answer as one content delta; then a chunk with
``finish_reason: "stop"`` and the ``conductor`` record; a usage chunk (``choices: []``)
when ``stream_options.include_usage``; then ``data: [DONE]``. An error after the stream has
begun is sent as ``data: {"error": {...}}`` (the official client raises it) before
``[DONE]``. Idle gaps carry SSE comments (``: keep-alive``), which clients skip.

Per-request budgets, as extra body fields (``extra_body`` in the OpenAI client):
``max_steps``, ``max_tokens`` (all worker tokens of the request, prompt and completion;
``max_completion_tokens`` is read the same way), ``max_cost_usd``, ``max_rounds``. Defaults
come from ``conductor.budget`` / ``conductor.max_rounds``; ceilings from
``serving.limits``. A zero or negative budget, or one over the ceiling, is a 400 that says
so. ``temperature`` and other sampling fields are ignored: the Conductor samples as
configured; ``seed`` is honoured.

Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``: 400 (bad
JSON, no messages, last message not the user's, question too long, bad budget, a field of
the wrong type or out of range, NaN/Infinity, deep nesting: ``serving.schema``), 401
(missing or wrong bearer token, when a key is configured; the scheme is case-insensitive), 404 (unknown model), 413 (body
too large), 429 (at ``max_concurrency``; ``Retry-After`` set; refused at once, not queued),
502 (the Conductor wrote no parseable workflow), 503 (policy not loaded), 504
(``request_timeout_s`` passed).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from conductor_pipeline.serving.errors import ApiError
from conductor_pipeline.serving.models import PUBLIC_NAME, ServedModel
from conductor_pipeline.serving.schema import ConductorRequest, Message, parse_request, read_json
from conductor_pipeline.serving.settings import ServingSettings
from conductor_pipeline.workflow.executor import Budget
from conductor_pipeline.workflow.orchestrator import (
    OrchestrationConfig,
    OrchestrationResult,
    orchestrate,
)

log = logging.getLogger(__name__)
access_log = logging.getLogger("conductor_pipeline.serving.access")

KEEPALIVE_S = 15.0
WARNING_HEADER = "X-Conductor-Warning"
_CONTEXT_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


# --- what the app serves ------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """An endpoint checked by ``GET /ready`` (its URL never leaves the server)."""

    name: str
    url: str
    api_key: str | None = None

    def __repr__(self) -> str:
        return f"Probe({self.name!r})"


@dataclass
class ConductorService:
    """Everything a request needs: the policy, the pool, how to orchestrate, what is served.

    ``call_worker`` is a ``WorkerPool`` or any worker caller; ``tracer(result, tags)``
    records a trace and returns its id (``serving.tracing``); ``api_key`` enables bearer
    auth. ``question_check`` (``async (question) -> QuestionCheck | None``) tells whether the
    sandbox knows a question; by default the pool's own (``open_worker_pool`` sets one on a
    sandbox with simulated workers).
    """

    policy: Any
    call_worker: Any
    descriptions: list[str]
    worker_names: list[str]
    orchestration: OrchestrationConfig
    served: ServedModel = field(default_factory=ServedModel)
    settings: ServingSettings = field(default_factory=ServingSettings)
    api_key: str | None = None
    probes: list[Probe] = field(default_factory=list)
    tracer: Callable[[OrchestrationResult, dict[str, str]], str | None] | None = None
    question_check: Callable[[str], Awaitable[Any]] | None = None

    def __post_init__(self) -> None:
        if self.question_check is None:
            self.question_check = getattr(self.call_worker, "question_check", None)

    def __repr__(self) -> str:  # never the key
        return f"ConductorService(policy={getattr(self.policy, 'name', self.policy)!r}, served={self.served.id!r})"


# --- request schema (serving.schema) ------------------------------------------------------

_Message = Message  # the names this module exported before the schema moved
_ChatRequest = ConductorRequest


def _text(message: _Message, index: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            parts.append(str(part.get("text") or ""))
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ApiError(
                400,
                f"messages[{index}]: only text content is supported, got a {kind!r} part",
                param=f"messages.{index}.content",
                code="unsupported_content",
            )
    return "\n".join(parts)


def compose_question(
    messages: Sequence[_Message], max_question_chars: int, max_context_chars: int
) -> tuple[str, int]:
    """The question given to the Conductor and the number of earlier turns it carries.

    Earlier turns become a transcript above the question (one ``role: text`` line per turn,
    newlines folded), keeping the most recent turns within ``max_context_chars``.
    """
    for index, message in enumerate(messages):
        if message.role not in _CONTEXT_ROLES:
            raise ApiError(
                400,
                f"messages[{index}].role: unknown role {message.role!r}",
                param=f"messages.{index}.role",
            )
    last = messages[-1]
    if last.role != "user":
        raise ApiError(
            400,
            f"the last message must be the user's question, got role {last.role!r}",
            param="messages",
            code="last_message_not_user",
        )
    question = _text(last, len(messages) - 1).strip()
    if not question:
        raise ApiError(
            400, "the last user message is empty", param="messages", code="empty_question"
        )
    if len(question) > max_question_chars:
        raise ApiError(
            400,
            f"the question has {len(question)} characters; this server accepts at most "
            f"{max_question_chars} (serving.max_question_chars)",
            param="messages",
            code="question_too_long",
        )
    lines: list[str] = []
    used = 0
    for index in range(len(messages) - 2, -1, -1):
        text = " ".join(_text(messages[index], index).split())
        if not text:
            continue
        line = f"{messages[index].role}: {text}"
        if used + len(line) > max_context_chars:
            if not lines and max_context_chars > 20:  # at least the latest turn, cropped
                lines.append(line[: max_context_chars - 6].rstrip() + " [...]")
            break
        lines.append(line)
        used += len(line) + 1
    if not lines:
        return question, 0
    transcript = "\n".join(reversed(lines))
    composed = (
        "Earlier turns of this conversation, for context:\n"
        f"{transcript}\n\nThe question to answer now:\n{question}"
    )
    return composed, len(lines)


def _budget_value(name: str, value: float | None, ceiling: float | None) -> None:
    if value is None:
        return
    if value <= 0:
        raise ApiError(
            400,
            f"{name} must be positive, got {value}: a zero budget would allow no worker call",
            param=name,
            code="invalid_budget",
        )
    if ceiling is not None and value > ceiling:
        raise ApiError(
            400,
            f"{name}={value} exceeds this server's limit of {ceiling} (serving.limits.{name})",
            param=name,
            code="budget_over_limit",
        )


def _capped(value: float | None, ceiling: float | None) -> float | None:
    if value is None:
        return ceiling
    return value if ceiling is None else min(value, ceiling)


def request_config(
    body: _ChatRequest, base: OrchestrationConfig, settings: ServingSettings
) -> OrchestrationConfig:
    """The orchestration settings for one request: its budgets over the defaults."""
    limits = settings.limits
    token_fields = [v for v in (body.max_tokens, body.max_completion_tokens) if v is not None]
    max_tokens = min(token_fields) if token_fields else None
    _budget_value("max_steps", body.max_steps, limits.max_steps)
    _budget_value("max_tokens", max_tokens, limits.max_tokens)
    _budget_value("max_cost_usd", body.max_cost_usd, limits.max_cost_usd)
    if body.max_rounds is not None:
        if body.max_rounds < 0:
            raise ApiError(
                400, "max_rounds must be >= 0", param="max_rounds", code="invalid_budget"
            )
        if limits.max_rounds is not None and body.max_rounds > limits.max_rounds:
            raise ApiError(
                400,
                f"max_rounds={body.max_rounds} exceeds this server's limit of "
                f"{limits.max_rounds} (serving.limits.max_rounds)",
                param="max_rounds",
                code="budget_over_limit",
            )
    default = base.budget
    budget = Budget(
        max_steps=body.max_steps or _capped(default.max_steps, limits.max_steps),
        max_tokens=max_tokens or _capped(default.max_tokens, limits.max_tokens),
        max_cost_usd=body.max_cost_usd or _capped(default.max_cost_usd, limits.max_cost_usd),
    )
    rounds = body.max_rounds if body.max_rounds is not None else base.max_rounds
    if limits.max_rounds is not None:
        rounds = min(rounds, limits.max_rounds)
    return dataclasses.replace(
        base,
        budget=budget,
        max_rounds=rounds,
        seed=base.seed if body.seed is None else body.seed,
    )


# --- records ------------------------------------------------------------------------------


def conductor_record(
    result: OrchestrationResult,
    served: ServedModel,
    request_id: str,
    config: OrchestrationConfig,
    trace_id: str | None = None,
    question_check: Any = None,
) -> dict[str, Any]:
    """The ``conductor`` field of a response: what ran, what it cost, which model wrote it,
    and (``question_check``, a ``QuestionCheck``) whether the sandbox knew the question."""
    record = result.to_dict()
    executions = [r.execution for r in result.rounds if r.execution is not None]
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
        "stopped_by": next((e.stopped_by for e in executions if e.stopped_by), None),
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
        # the sandbox's simulated workers made the answer up: the question is none of the
        # prepared tasks they know (DESIGN.md: `conductor.simulated`)
        "simulated": bool(question_check is not None and not question_check.known),
        "sandbox_known_question": question_check.known if question_check else None,
        "warning": question_check.warning if question_check else None,
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


# --- plumbing -----------------------------------------------------------------------------


class _Gate:
    """Bounded concurrency that refuses instead of queueing (one event loop, no lock needed)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.active = limit, 0

    def try_enter(self) -> bool:
        if self.active >= self.limit:
            return False
        self.active += 1
        return True

    def leave(self) -> None:
        self.active = max(self.active - 1, 0)


class _GuardedStream(StreamingResponse):
    """A streaming response that runs ``on_close`` however the stream ends."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None], **kwargs: Any):
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[override]
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class _RequestLog:
    """ASGI middleware: a request id (``x-request-id``) and one JSON log line per request,
    written when the last body byte is sent (so streams are timed to their end). Headers
    are never logged."""

    QUIET = {"/health", "/ready"}

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        details: dict[str, Any] = {}
        scope["conductor.request_id"] = request_id
        scope["conductor.log"] = details
        started = time.perf_counter()
        status: int | None = None
        written = False

        def write(final_status: int | None, outcome: str) -> None:
            nonlocal written
            if written:
                return
            written = True
            if scope.get("path") in self.QUIET and final_status == 200:
                return
            fields = {
                "event": "request",
                "request_id": request_id,
                "method": scope.get("method"),
                "path": scope.get("path"),
                "status": final_status,
                "outcome": outcome,
                "latency_s": round(time.perf_counter() - started, 4),
                **details,
            }
            access_log.info("request", extra={"fields": fields})

        async def send_wrapper(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
                message = {**message, "headers": headers}
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                write(status, "completed")

        try:
            await self.app(scope, receive, send_wrapper)
        except BaseException:
            write(status or 500, "error")
            raise
        finally:
            write(status, "client_disconnected" if status else "no_response")


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


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else _dumps(data)}\n\n"


# --- the app ------------------------------------------------------------------------------


# two different questions: what their planning prompts share is the cached opening
_WARM_UP_QUESTIONS = ("What is 2 + 2?", "Is every square a rectangle? Answer Yes or No.")


def create_app(service: ConductorService) -> FastAPI:
    """The FastAPI app serving ``service``. The policy's ``load()`` (if any) runs in a thread
    when the app starts; ``/health`` answers 503 until it is done."""
    settings = service.settings
    served = service.served
    gate = _Gate(settings.max_concurrency)
    state: dict[str, Any] = {"policy": "loading", "policy_error": None, "probe": None}
    started_at = int(time.time())
    model_ids = set(served.model_ids())
    expected_key = service.api_key.encode() if service.api_key else None

    async def load_policy() -> None:
        loader = getattr(service.policy, "load", None)
        try:
            if callable(loader):
                await asyncio.to_thread(loader)
            await warm_up_policy()
            state["policy"] = "ready"
            log.info("Conductor policy %s ready", getattr(service.policy, "name", "?"))
        except Exception as exc:  # reported through /health and /ready
            state["policy"], state["policy_error"] = "error", f"{type(exc).__name__}: {exc}"
            log.exception("loading the Conductor policy failed")

    async def warm_up_policy() -> None:
        # a policy with warm_up (LocalPolicy) keeps the planning prompt's opening (rules and
        # workers, all before the question) cached and runs one short generation, so neither
        # the first request nor any later one pays for them; /health turns 200 after this
        warm_up = getattr(service.policy, "warm_up", None)
        if not (settings.warm_up and callable(warm_up)):
            return
        from conductor_pipeline.workflow.prompts import conductor_messages

        prompt = service.orchestration.prompt
        conversations = [
            conductor_messages(question, service.descriptions, prompt)
            for question in _WARM_UP_QUESTIONS
        ]
        start = time.perf_counter()
        shared = await asyncio.to_thread(warm_up, conversations)
        log.info(
            "Conductor policy warmed up in %.1f s (%d prompt tokens cached)",
            time.perf_counter() - start,
            shared,
        )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        loading = asyncio.create_task(load_policy())
        try:
            yield
        finally:
            if not loading.done():
                loading.cancel()

    app = FastAPI(title="Conductor API", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(_RequestLog)
    app.state.service = service
    app.state.gate = gate
    app.state.status = state

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        details = request.scope.get("conductor.log")
        if isinstance(details, dict):
            details["error_code"] = exc.code or exc.kind
        return SafeJSONResponse(status_code=exc.status, content=exc.body(), headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # the exception is logged by the server; the client learns only the request id
        request_id = request.scope.get("conductor.request_id", "?")
        error = ApiError(500, f"internal error (request {request_id})", kind="server_error")
        return SafeJSONResponse(status_code=500, content=error.body())

    def authorize(request: Request) -> None:
        if expected_key is None:
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
            token.strip().encode(), expected_key
        ):
            raise ApiError(
                401,
                "invalid API key",
                kind="authentication_error",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def check_policy() -> None:
        if state["policy"] == "loading":
            raise ApiError(
                503,
                "the Conductor policy is still loading; retry shortly",
                kind="service_unavailable",
                code="loading",
                headers={"Retry-After": "5"},
            )
        if state["policy"] == "error":
            raise ApiError(
                503,
                "the Conductor policy failed to load; see the server log",
                kind="service_unavailable",
                code="policy_unavailable",
            )

    async def trace(result: OrchestrationResult, request_id: str) -> str | None:
        if service.tracer is None:
            return None
        tags = {"request_id": request_id, "model_version": served.id, "source": "serving"}
        try:
            return await asyncio.to_thread(service.tracer, result, tags)
        except Exception as exc:  # tracing must never fail a request
            log.warning("MLflow trace not recorded for %s: %s", request_id, type(exc).__name__)
            return None

    async def run(
        question: str, config: OrchestrationConfig, on_event: Callable[[str, Any], None] | None
    ) -> OrchestrationResult:
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
                timeout=settings.request_timeout_s,
            )
        except TimeoutError as err:
            raise ApiError(
                504,
                f"the request took longer than {settings.request_timeout_s:g} s "
                "(serving.request_timeout_s) and was stopped",
                kind="timeout_error",
                code="timeout",
            ) from err

    async def check_question(question: str) -> Any:
        """Whether the sandbox knows the question (None over real workers, or when the
        sandbox could not say): the answer to an unknown one is made up and is marked."""
        if service.question_check is None:
            return None
        try:
            return await service.question_check(question)
        except Exception as exc:  # a notice must never fail the request
            log.warning("question check failed: %s", type(exc).__name__)
            return None

    def note(details: dict[str, Any], result: OrchestrationResult) -> None:
        final = result.final_round
        details.update(
            model_version=served.id,
            steps=len(final.execution.steps) if final and final.execution else 0,
            worker_calls=result.worker_calls,
            cost_usd=round(result.worker_cost_usd, 8),
            tokens=result.worker_tokens,
            conductor_tokens=result.conductor_tokens,
            format_failure=result.format_failure,
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

    @app.get("/health")
    async def health() -> JSONResponse:
        if state["policy"] == "ready":
            return SafeJSONResponse({"status": "ok", "model": served.id})
        body = {"status": state["policy"]}
        if state["policy_error"]:
            body["detail"] = state["policy_error"]
        return SafeJSONResponse(status_code=503, content=body)

    async def probe() -> dict[str, Any]:
        cached = state["probe"]
        if cached and time.monotonic() - cached[0] < 2.0:
            return cached[1]
        import httpx

        async def one(p: Probe) -> bool:
            headers = {"Authorization": f"Bearer {p.api_key}"} if p.api_key else {}
            try:
                async with httpx.AsyncClient(timeout=2.0) as client:
                    return (await client.get(p.url, headers=headers)).status_code < 500
            except httpx.HTTPError:
                return False

        results = await asyncio.gather(*(one(p) for p in service.probes))
        report = {
            "probed": len(results),
            "reachable": sum(results),
            "unreachable": [
                p.name for p, ok in zip(service.probes, results, strict=True) if not ok
            ],
        }
        state["probe"] = (time.monotonic(), report)
        return report

    @app.get("/ready")
    async def ready() -> JSONResponse:
        endpoints = await probe()
        ok = state["policy"] == "ready" and not endpoints["unreachable"]
        return SafeJSONResponse(
            status_code=200 if ok else 503,
            content={
                "status": "ready" if ok else "not_ready",
                "policy": state["policy"],
                "endpoints": endpoints,
                "in_flight": gate.active,
                "max_concurrency": gate.limit,
                "model": served.id,
            },
        )

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorize(request)
        entry = {"object": "model", "created": started_at, "owned_by": "conductor-pipeline"}
        data = [
            {
                "id": PUBLIC_NAME,
                **entry,
                "version": served.version,
                "alias": served.alias,
                "served": served.id,
            },
            {
                "id": served.id,
                **entry,
                "version": served.version,
                "alias": served.alias,
                "served": served.id,
            },
        ]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        request_id = (
            request.scope.get("conductor.request_id") or f"chatcmpl-{uuid.uuid4().hex[:24]}"
        )
        details = request.scope.setdefault("conductor.log", {})
        authorize(request)
        body = parse_request(await read_json(request, settings.max_body_bytes), model_ids)
        question, context_turns = compose_question(
            body.messages, settings.max_question_chars, settings.max_context_chars
        )
        config = request_config(body, service.orchestration, settings)
        details.update(
            stream=bool(body.stream), question_chars=len(question), context_turns=context_turns
        )
        check_policy()
        checked = await check_question(question)
        warning_headers = (
            {WARNING_HEADER: checked.warning} if checked is not None and checked.warning else {}
        )
        if not gate.try_enter():
            raise ApiError(
                429,
                f"the server is busy: {gate.limit} requests in flight, its limit "
                f"(serving.max_concurrency); retry after {settings.retry_after_s} s",
                kind="rate_limit_error",
                code="server_busy",
                headers={"Retry-After": str(settings.retry_after_s)},
            )
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return _GuardedStream(
                stream(request_id, body.model, question, config, include_usage, details, checked),
                on_close=gate.leave,
                media_type="text/event-stream",
                headers={
                    "Cache-Control": "no-cache",
                    "X-Accel-Buffering": "no",
                    **warning_headers,
                },
            )
        try:
            result = await run(question, config, None)
        finally:
            gate.leave()
        note(details, result)
        trace_id = await trace(result, request_id)
        record = conductor_record(result, served, request_id, config, trace_id, checked)
        if result.format_failure:
            raise format_failure(result, record)
        return SafeJSONResponse(
            {
                "id": request_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.model,
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
            },
            headers=warning_headers,
        )

    async def stream(
        request_id: str,
        model: str,
        question: str,
        config: OrchestrationConfig,
        include_usage: bool,
        details: dict[str, Any],
        checked: Any = None,
    ) -> AsyncIterator[str]:
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
            return {
                "id": request_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": served.id,
                "choices": [
                    {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
                ],
                **extra,
            }

        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def on_event(kind: str, payload: Any) -> None:
            event = event_payload(kind, payload, service.worker_names)
            if event is not None:
                queue.put_nowait(("event", event))

        async def work() -> None:
            try:
                queue.put_nowait(("done", await run(question, config, on_event)))
            except ApiError as exc:
                queue.put_nowait(("error", exc))
            except Exception:
                log.exception("request %s failed", request_id)
                queue.put_nowait(
                    (
                        "error",
                        ApiError(
                            500, f"internal error (request {request_id})", kind="server_error"
                        ),
                    )
                )

        task = asyncio.create_task(work(), name=f"conductor-{request_id}")
        try:
            yield _sse(chunk({"role": "assistant", "content": ""}))
            while True:
                try:
                    kind, item = await asyncio.wait_for(queue.get(), timeout=KEEPALIVE_S)
                except TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                if kind == "event":
                    yield _sse(chunk({}, conductor_event=item))
                    continue
                if kind == "error":
                    details["error_code"] = item.code or item.kind
                    yield _sse(item.body())
                    break
                result: OrchestrationResult = item
                note(details, result)
                trace_id = await trace(result, request_id)
                record = conductor_record(result, served, request_id, config, trace_id, checked)
                if result.format_failure:
                    error = format_failure(result, record)
                    details["error_code"] = error.code
                    yield _sse(error.body())
                    break
                if result.answer:
                    yield _sse(chunk({"content": result.answer}))
                yield _sse(chunk({}, "stop", conductor=record))
                if include_usage:
                    yield _sse({**chunk({}), "choices": [], "usage": usage(result)})
                break
            yield _sse("[DONE]")
        finally:
            if not task.done():
                task.cancel()

    return app
