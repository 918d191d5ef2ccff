"""The Conductor API's request: the shared OpenAI chat shape (``workers.chat_request``)
plus the Conductor's per-request budget fields, read and validated into a 4xx
:class:`~conductor_pipeline.serving.errors.ApiError` that names the field."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

from conductor_pipeline.serving.errors import ApiError
from conductor_pipeline.workers.chat_request import (
    ChatRequest,
    Int64,
    Message,
    RequestError,
    load_json_body,
    validate_request,
)

__all__ = ["ConductorRequest", "Message", "StreamOptions", "parse_request", "read_json"]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: bool | None = None


class ConductorRequest(ChatRequest):
    """A chat request to the Conductor: its budgets ride as extra body fields."""

    stream_options: StreamOptions | None = None
    max_cost_usd: float | None = Field(default=None, allow_inf_nan=False)
    max_steps: Int64 | None = None
    max_rounds: Int64 | None = None


def _bad_request(err: RequestError) -> ApiError:
    return ApiError(400, err.message, param=err.param, code=err.code)


async def read_json(request: Request, limit: int) -> Any:
    """The request's JSON body, read up to ``limit`` bytes (413 past it, counted while
    reading when no Content-Length is sent); 400 for anything :func:`load_json_body`
    refuses."""
    declared = request.headers.get("content-length", "")
    too_large = ApiError(
        413,
        f"request body larger than {limit} bytes (serving.max_body_bytes)",
        code="request_too_large",
    )
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    try:
        return load_json_body(b"".join(chunks))
    except RequestError as err:
        raise _bad_request(err) from err


def parse_request(raw: Any, model_ids: Collection[str]) -> ConductorRequest:
    """``raw`` as a :class:`ConductorRequest` for one of ``model_ids`` (404 otherwise)."""
    if not isinstance(raw, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_body")
    messages = raw.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(
            400,
            "the request has no messages: send messages=[{'role': 'user', 'content': '<question>'}]",
            param="messages",
            code="missing_messages",
        )
    try:
        body = validate_request(raw, ConductorRequest)
    except RequestError as err:
        raise _bad_request(err) from err
    if body.model not in model_ids:
        raise ApiError(
            404,
            f"the model {body.model!r} is not served here (available: {', '.join(sorted(model_ids))})",
            param="model",
            code="model_not_found",
        )
    if body.n is not None and body.n != 1:
        raise ApiError(
            400,
            f"n={body.n}: the Conductor returns one choice per request; send n=1 or leave it out",
            param="n",
        )
    return body
