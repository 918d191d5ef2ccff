"""The sandbox pool server's endpoints, as functions of the request over one :class:`AppState`
(``request.app.state.sandbox``, set by :func:`~conductor_pipeline.workers.sandbox.server.create_app`).

A chat request is read and validated by the shared rules of ``workers.chat_request`` (plus
the sampling bounds of :class:`SandboxChatRequest`), then answered by the simulated worker
it names or by the real model's batches (``workers.sandbox.real_workers``). Errors use
OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import Field

from conductor_pipeline.workers.chat_request import (
    ChatRequest,
    Int64,
    RequestError,
    load_json_body,
    validate_request,
)
from conductor_pipeline.workers.sandbox.profiles import SandboxProfiles
from conductor_pipeline.workers.sandbox.questions import recognise
from conductor_pipeline.workers.sandbox.real_workers import RealWorkers
from conductor_pipeline.workers.sandbox.simulated import SimulatedWorker, TaskIndex, message_text

OWNED_BY_SIMULATED = "sandbox-simulated"
OWNED_BY_REAL = "sandbox-local"


class SandboxChatRequest(ChatRequest):
    """The shared OpenAI chat request (``workers.chat_request``) with sampling bounds."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0, allow_inf_nan=False)
    max_tokens: Int64 | None = Field(default=None, ge=1)
    max_completion_tokens: Int64 | None = Field(default=None, ge=1)
    n: Int64 | None = Field(default=1, ge=1)


@dataclass
class AppState:
    """What the endpoints share: the profiles, the prepared tasks, the workers, and whether
    the real model loads in this app (``loading``; without it the app is ready at once)."""

    profiles: SandboxProfiles
    index: TaskIndex
    sims: dict[str, SimulatedWorker]
    real: RealWorkers
    loading: bool
    latency_scale: float
    started_at: int = field(default_factory=lambda: int(time.time()))


LOAD_POLL_S = 0.1  # how often a request for a real worker looks whether its model has loaded


def app_state(request: Request) -> AppState:
    return request.app.state.sandbox


# --- responses ----------------------------------------------------------------------------


def error_response(
    status: int, message: str, *, kind: str, code: str | None = None, param: str | None = None
) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(status_code=status, content=body)


def completion_response(
    model: str,
    text: str,
    prompt_tokens: int,
    completion_tokens: int,
    finish_reason: str,
    *,
    simulated: bool,
) -> JSONResponse:
    return JSONResponse(
        content={
            "id": f"chatcmpl-sandbox-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "sandbox-simulated" if simulated else "sandbox-local",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )


# --- endpoints ----------------------------------------------------------------------------


async def health(request: Request) -> JSONResponse:
    state = app_state(request)
    real = state.real
    if not real.ready.is_set():
        return JSONResponse(status_code=503, content={"status": "loading"})
    if state.loading and real.error:
        return JSONResponse(status_code=503, content={"status": "error", "detail": real.error})
    return JSONResponse(
        content={
            "status": "ok",
            "workers": state.profiles.names,
            "tasks": len(state.index),
            "real_model_loaded": real.model is not None,
            "real_model_dtype": real.loaded_dtype,
            # batches of the real model, and the most requests one of them served (the
            # ones that joined it while it wrote included)
            "real_model_batches": len(real.batch_sizes),
            "real_model_max_batch": max(real.batch_sizes, default=0),
            "real_model_abandoned": real.abandoned,
            "real_model_concurrency": real.concurrency,  # batches generating at once
        }
    )


async def recognise_question(request: Request) -> JSONResponse:
    # Not part of the OpenAI API: lets a client warn that the simulated workers will
    # make up an answer to a question that is none of the prepared tasks.
    index = app_state(request).index
    try:
        raw = load_json_body(await request.body())
    except RequestError as err:
        return error_response(400, err.message, kind="invalid_request_error", code=err.code)
    text = raw.get("text") if isinstance(raw, dict) else None
    if not isinstance(text, str):
        return error_response(
            400,
            'expected a JSON object {"text": "<question>"}',
            kind="invalid_request_error",
            param="text",
        )
    return JSONResponse(content={**recognise(index, text).to_dict(), "tasks": len(index)})


async def models(request: Request) -> dict[str, Any]:
    state = app_state(request)
    owners = [(p, OWNED_BY_SIMULATED) for p in state.profiles.simulated]
    owners += [(p, OWNED_BY_REAL) for p in state.profiles.real]
    data = [
        {
            "id": p.name,
            "object": "model",
            "created": state.started_at,
            "owned_by": owner,
            "description": p.description,
        }
        for p, owner in owners
    ]
    return {"object": "list", "data": data}


async def chat_completions(request: Request) -> JSONResponse:
    state = app_state(request)
    try:
        body = validate_request(load_json_body(await request.body()), SandboxChatRequest)
    except RequestError as err:
        return error_response(
            400, err.message, kind="invalid_request_error", param=err.param, code=err.code
        )
    refused = _unsupported(body)
    if refused is not None:
        return refused
    if body.model in state.sims:
        return await _answer_simulated(state, body)
    if body.model in state.real.profiles:
        return await _answer_real(state, body, request)
    known = ", ".join(state.profiles.names)
    return error_response(
        404,
        f"The model {body.model!r} does not exist in the sandbox pool (available: {known})",
        kind="invalid_request_error",
        param="model",
        code="model_not_found",
    )


# --- answering a chat request -------------------------------------------------------------


def _unsupported(body: SandboxChatRequest) -> JSONResponse | None:
    """The 400 for a valid request the sandbox does not serve (streaming, several choices)."""
    if body.stream:
        return error_response(
            400,
            "streaming is not supported by the sandbox worker server; send stream=false",
            kind="invalid_request_error",
            param="stream",
            code="stream_not_supported",
        )
    if (body.n or 1) != 1:
        return error_response(
            400,
            "the sandbox returns one choice per request; send n=1",
            kind="invalid_request_error",
            param="n",
        )
    return None


def _temperature(body: SandboxChatRequest) -> float:
    return 1.0 if body.temperature is None else body.temperature


def _seed(body: SandboxChatRequest) -> int:
    return body.seed if body.seed is not None else 0


async def _answer_simulated(state: AppState, body: SandboxChatRequest) -> JSONResponse:
    reply = state.sims[body.model].respond(
        [m.model_dump() for m in body.messages],
        seed=_seed(body),
        temperature=_temperature(body),
        max_tokens=body.max_completion_tokens or body.max_tokens,
    )
    if state.latency_scale > 0 and reply.latency_s > 0:
        await asyncio.sleep(reply.latency_s * state.latency_scale)
    return completion_response(
        body.model,
        reply.text,
        reply.prompt_tokens,
        reply.completion_tokens,
        reply.finish_reason,
        simulated=True,
    )


async def _until_disconnected(request: Request, poll_s: float = 0.5) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(poll_s)


async def _answer_real(state: AppState, body: SandboxChatRequest, request: Request) -> JSONResponse:
    real = state.real
    # A request that comes while the model loads waits for it: the pool is handed out before
    # the load ends (5-30 s), so that the work that needs no real worker starts at once
    while not real.ready.is_set():
        if await request.is_disconnected():
            return error_response(499, "the client closed the connection", kind="cancelled")
        await asyncio.sleep(LOAD_POLL_S)
    if real.model is None:
        reason = real.error or "the server was started without the real model"
        return error_response(
            503,
            f"worker {body.model!r} is unavailable: {reason}",
            kind="service_unavailable",
            code="model_unavailable",
        )
    profile_limit = real.profiles[body.model].max_tokens
    limit = min(body.max_completion_tokens or body.max_tokens or profile_limit, profile_limit)
    messages = [m.model_dump() for m in body.messages]
    chat = [{"role": m["role"], "content": message_text(m)} for m in messages]
    reply = asyncio.wrap_future(real.submit(chat, limit, _temperature(body), _seed(body)))
    # A caller that gave up (its timeout, then a retry) closes the connection: its reply is
    # cancelled, so the batcher skips it instead of generating for nobody. Without this,
    # abandoned requests queue up behind slow batches and every retry times out in turn.
    gone = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({reply, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not reply.done():
        reply.cancel()
        return error_response(499, "the client closed the connection", kind="cancelled")
    text, prompt_tokens, completion_tokens = reply.result()
    finish = "length" if completion_tokens >= limit else "stop"
    return completion_response(
        body.model, text, prompt_tokens, completion_tokens, finish, simulated=False
    )
