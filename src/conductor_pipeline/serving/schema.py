"""The Conductor API's request: the shared OpenAI chat shape (``workers.chat_request``)
plus the Conductor's per-request budget fields, read and validated into a 4xx
:class:`~conductor_pipeline.serving.errors.ApiError` that names the field; then what the
request asks of the Conductor: the question with its context (:func:`compose_question`) and
the orchestration settings with its budgets (:func:`request_config`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

from conductor_pipeline.serving.errors import ApiError
from conductor_pipeline.serving.settings import ServingSettings
from conductor_pipeline.tasks.sources.traffic import CONTEXT_OPENING, QUESTION_MARKER
from conductor_pipeline.workers.chat_request import (
    ChatRequest,
    Int64,
    Message,
    RequestError,
    load_json_body,
    validate_request,
)
from conductor_pipeline.workflow.executor import Budget
from conductor_pipeline.workflow.orchestrator import OrchestrationConfig

__all__ = [
    "ConductorRequest",
    "Message",
    "StreamOptions",
    "compose_question",
    "parse_request",
    "read_json",
    "request_config",
]

_CONTEXT_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


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


def _text(message: Message, index: int) -> str:
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
    messages: Sequence[Message], max_question_chars: int, max_context_chars: int
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
    # the traffic source reads the asked question back by these two strings
    composed = f"{CONTEXT_OPENING}{transcript}{QUESTION_MARKER}{question}"
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
    body: ConductorRequest, base: OrchestrationConfig, settings: ServingSettings
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
