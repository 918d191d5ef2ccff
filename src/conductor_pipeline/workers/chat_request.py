"""The OpenAI chat request as this project's two servers read it.

The sandbox pool server (``workers.sandbox.server``) and the Conductor API
(``serving.schema``, which adds its budget fields) accept the same body: a JSON object
with ``model`` and ``messages``. Reading it is one rule in one place:

* :func:`load_json_body` parses the bytes and refuses what standard JSON or this API does
  not allow: nesting deeper than :data:`MAX_JSON_DEPTH`, ``NaN``/``Infinity`` (Python's
  parser accepts them; JSON does not), numbers too large to hold, unpaired UTF-16
  surrogates (they cannot be written back as UTF-8). Each refusal names where it is.
* :class:`ChatRequest` validates field types strictly, as OpenAI does: ``"3"`` is not an
  integer and ``"yes"`` is not a boolean (pydantic would coerce both by default).

Both raise :class:`RequestError`, which each server turns into its 400 response.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

# A chat request nests about five levels (messages, content parts, their fields); JSON
# schemas sent as extra fields (tools, response_format) rarely pass twenty.
MAX_JSON_DEPTH = 64
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class RequestError(ValueError):
    """A request body this API refuses (a 400), with the field it is about."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def _where(path: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in path) or "body"


def load_json_body(raw: bytes) -> Any:
    """The parsed body, or :class:`RequestError` saying what is wrong with it."""
    try:
        value = json.loads(raw)
    except RecursionError as err:
        raise RequestError(
            f"request body nests deeper than {MAX_JSON_DEPTH} levels", code="json_too_deep"
        ) from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RequestError(f"request body is not valid JSON: {err}", code="invalid_json") from err
    except ValueError as err:  # an integer literal past Python's 4300-digit conversion limit
        raise RequestError(
            "request body holds a number too long to read (over 4300 digits)",
            code="invalid_number",
        ) from err
    check_json_value(value)
    return value


def check_json_value(value: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse deep nesting, non-finite numbers and unpaired surrogates anywhere in ``value``.

    Iterative, so that no input can exhaust the interpreter's stack.
    """
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(value, 1, ())]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                field = _where(path[:1])  # the whole path could be 64 levels long
                raise RequestError(
                    f"request body nests deeper than {max_depth} levels (in {field})",
                    param=None if field == "body" else field,
                    code="json_too_deep",
                )
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str):
                    _check_text(key, path, key=True)
                stack.append((child, depth + 1, (*path, key)))
        elif isinstance(item, float) and not math.isfinite(item):
            # NaN and Infinity are not JSON numbers, and 1e999 parses to Infinity
            raise RequestError(
                f"{_where(path)}: {json.dumps(item)} is not a finite number "
                "(JSON has no NaN or Infinity)",
                param=_where(path),
                code="invalid_number",
            )
        elif isinstance(item, str):
            _check_text(item, path)


def _check_text(text: str, path: tuple[str | int, ...], *, key: bool = False) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        where = _where(path)
        raise RequestError(
            f"{'a key in ' if key else ''}{where}: the string holds an unpaired UTF-16 "
            f"surrogate ({text[err.start]!r}), which is not text",
            param=None if where == "body" else where,
            code="invalid_string",
        ) from err


def _int64(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise PydanticCustomError(
            "int64_range",
            "Input should be an integer from {low} to {high} (signed 64 bits), got {value}",
            {"low": INT64_MIN, "high": INT64_MAX, "value": value},
        )
    return value


Int64 = Annotated[int, AfterValidator(_int64)]
"""An integer field: strict (no strings, floats or booleans) and within 64 bits."""


class Message(BaseModel):
    """One chat message; extra keys (``name``, ``tool_calls``...) are kept, not read."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: str
    content: str | list[Any] | None = None


class ChatRequest(BaseModel):
    """The fields both servers read; each server's subclass adds its own."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    stream: bool | None = False
    n: Int64 | None = 1
    seed: Int64 | None = None
    max_tokens: Int64 | None = None
    max_completion_tokens: Int64 | None = None


def validation_message(exc: ValidationError) -> tuple[str, str | None]:
    """The first validation error as ``(message, param)``: which field, what was wrong,
    and the JSON type that was sent."""
    first = exc.errors()[0]
    where = _where(tuple(p for p in first.get("loc", ())))
    message = f"invalid request body: {where}: {first.get('msg')}"
    if first.get("type", "").endswith("_type") and "input" in first:
        message += f" (got {_json_type(first['input'])})"
    return message, (None if where == "body" else where)


def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    for kind, name in names.items():
        if type(value) is kind:
            return f"{name}, {json.dumps(value)[:40]}"
    if value is None:
        return "null"
    return "an array" if isinstance(value, list) else "an object"


_Request = TypeVar("_Request", bound=ChatRequest)


def validate_request(raw: Any, model: type[_Request]) -> _Request:
    """``raw`` (a parsed body) validated as ``model``, or :class:`RequestError`."""
    if not isinstance(raw, dict):
        raise RequestError("request body must be a JSON object", code="invalid_body")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise RequestError(message, param=param) from exc
