"""The Conductor API: an OpenAI-compatible chat endpoint answered by orchestrated workflows.

This module holds policy loading and :func:`create_app`, which wires the parts:
``serving.service`` holds what is served (:class:`ConductorService`), ``serving.schema``
reads and validates a request, ``serving.handlers`` answers it (endpoints as functions over
one ``AppState``), ``serving.responses`` writes records, bodies and stream chunks,
``serving.middleware`` holds the concurrency gate, the guarded stream and the request log.

Endpoints (:func:`create_app`):

* ``POST /v1/chat/completions`` — ``model`` is ``conductor`` (or the served version's id,
  e.g. ``conductor/3``, or ``conductor@<alias>``). The last message must be the user's: it
  is the question. Earlier turns (system, user, assistant) become context: they are written
  before the question as a short transcript, one line per turn, most recent kept when
  longer than ``serving.max_context_chars``; the Conductor reads it and workers see it only
  where the Conductor (or ``question_to_workers``) passes it on. The answer is
  ``choices[0].message.content``; an extra top-level ``conductor`` field holds the executed
  workflow: steps with worker, subtask, access, tokens, cost and latency, the rounds, totals,
  the budget applied and the served model version. ``simulated`` is true when a simulated
  ``sim-*`` worker answered some step (the answer is no real model's). Over the sandbox's
  simulated workers, which know only the prepared tasks, the record's
  ``sandbox_known_question`` says whether the question is one of them; when it is not, the
  answer is made up: ``warning`` says so and what to do instead, and the response carries
  the same text in an ``X-Conductor-Warning`` header (streamed or not). Over real workers
  ``sandbox_known_question`` and ``warning`` are null, ``simulated`` is false and no header
  is sent.
* ``POST /v1/feedback`` — a reference answer, a verdict (``right``/``wrong``) or a score for
  the ``request_id`` of an earlier completion (``serving.feedback``), authorized like the
  chat endpoint. With ``serving.capture.enabled`` each answered request is kept in the
  capture store (``serving.capture``) so feedback can be joined to it; off by default.
* ``GET /v1/models`` — ``conductor`` and the served version id; both this and ``/ready``
  say whether capture is on, where, and its retention (``capture``).
* ``GET /health`` — liveness: 200 once the policy is loaded, 503 while it loads or if loading
  failed. ``GET /ready`` — readiness: the policy is loaded and every worker endpoint answers.
* ``GET /openapi.json`` — the OpenAPI schema, authorized like the chat endpoint (a key, when
  one is configured, guards it too); the interactive ``/docs`` and ``/redoc`` are not served.

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
(missing or wrong bearer token, when a key is configured; the scheme is
case-insensitive), 404 (unknown model; on ``/v1/feedback`` a request capture does not
hold), 409 (different feedback already given for that request), 413 (body too large),
429 (at ``max_concurrency``; ``Retry-After`` set; refused at once, not queued), 502 (the
Conductor wrote no parseable workflow), 503 (policy not loaded), 504 (``request_timeout_s``
passed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from fastapi import FastAPI, Request

from conductor_pipeline.paths import project_root
from conductor_pipeline.serving import handlers
from conductor_pipeline.serving.capture import CaptureStore
from conductor_pipeline.serving.errors import ApiError
from conductor_pipeline.serving.handlers import AppState
from conductor_pipeline.serving.logs import secret_values
from conductor_pipeline.serving.middleware import Gate, RequestLog
from conductor_pipeline.serving.responses import SafeJSONResponse
from conductor_pipeline.serving.service import ConductorService

log = logging.getLogger(__name__)

__all__ = ["create_app"]


# --- the app ------------------------------------------------------------------------------


# two different questions: what their planning prompts share is the cached opening
_WARM_UP_QUESTIONS = ("What is 2 + 2?", "Is every square a rectangle? Answer Yes or No.")


async def load_policy(state: AppState) -> None:
    """Load the policy (its ``load()`` in a thread) and warm it up; ``/health`` and
    ``/ready`` report the outcome."""
    policy = state.service.policy
    loader = getattr(policy, "load", None)
    try:
        if callable(loader):
            await asyncio.to_thread(loader)
        await warm_up_policy(state.service)
        state.policy = "ready"
        # a local model's precision: a server may run it at another than evaluation did
        loaded = getattr(policy, "loaded_dtype", None)
        name = getattr(policy, "name", "?")
        log.info("Conductor policy %s ready%s", name, f" ({loaded})" if loaded else "")
    except Exception as exc:  # reported through /health and /ready
        state.policy, state.policy_error = "error", f"{type(exc).__name__}: {exc}"
        log.exception("loading the Conductor policy failed")


async def warm_up_policy(service: ConductorService) -> None:
    # a policy with warm_up (LocalPolicy) keeps the planning prompt's opening (rules and
    # workers, all before the question) cached and runs one short generation, so neither
    # the first request nor any later one pays for them; /health turns 200 after this
    warm_up = getattr(service.policy, "warm_up", None)
    if not (service.settings.warm_up and callable(warm_up)):
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


def create_app(service: ConductorService) -> FastAPI:
    """The FastAPI app serving ``service``. The policy's ``load()`` (if any) runs in a thread
    when the app starts; ``/health`` answers 503 until it is done."""
    # the capture store opens here (retention applied) so a bad setting fails at start-up;
    # with capture off it touches no file
    capture = CaptureStore(
        service.settings.capture,
        service.root or project_root(),
        secrets=secret_values(service.api_key, service.secrets),
    )
    state = AppState(
        service=service,
        gate=Gate(service.settings.max_concurrency),
        model_ids=frozenset(service.served.model_ids()),
        capture=capture,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        loading = asyncio.create_task(load_policy(state))
        try:
            yield
        finally:
            if not loading.done():
                loading.cancel()

    # the interactive docs are off; the schema is served by a route of our own so that it
    # sits behind the same bearer key as the API (FastAPI's own /openapi.json is open)
    app = FastAPI(
        title="Conductor API", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.add_middleware(RequestLog)
    app.state.conductor = state
    app.state.service, app.state.gate = service, state.gate
    app.add_exception_handler(ApiError, handlers.api_error)
    app.add_exception_handler(Exception, handlers.unexpected)
    app.add_api_route("/health", handlers.health, methods=["GET"])
    app.add_api_route("/ready", handlers.ready, methods=["GET"])
    app.add_api_route("/v1/models", handlers.models, methods=["GET"])
    app.add_api_route(
        "/v1/chat/completions", handlers.chat_completions, methods=["POST"], response_model=None
    )
    app.add_api_route("/v1/feedback", handlers.feedback, methods=["POST"], response_model=None)

    async def openapi_schema(request: Request) -> SafeJSONResponse:
        handlers.authorize(state, request)
        return SafeJSONResponse(app.openapi())

    app.add_api_route("/openapi.json", openapi_schema, methods=["GET"], include_in_schema=False)
    return app
