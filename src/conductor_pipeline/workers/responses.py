"""Reading what a Router call gave back: the reply's text or a typed failure, its token
counts, its dollars, and the failure kind of an exception.

Tokens come from the response's ``usage`` (``litellm.token_counter`` when absent) and
dollars from the answering worker's configured prices, else from ``litellm.completion_cost``
(0 with ``cost_source="unknown"`` when litellm has no price). ``litellm.Timeout`` is a
TIMEOUT, ``RateLimitError`` a RATE_LIMIT, anything else from the provider a PROVIDER_ERROR;
an empty reply is EMPTY_REPLY and a reply that is not text MALFORMED_REPLY.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from .config import WorkerSpec
from .pricing import token_prices
from .types import FailureKind

__all__ = [
    "attempts_floor",
    "failure_kind",
    "reply_content",
    "reply_cost",
    "reply_tokens",
    "router_headers",
]

log = logging.getLogger(__name__)


def failure_kind(exc: BaseException) -> FailureKind:
    """The failure a Router exception stands for."""
    import litellm

    if isinstance(exc, litellm.Timeout | asyncio.TimeoutError | TimeoutError):
        return FailureKind.TIMEOUT
    if isinstance(exc, litellm.RateLimitError):
        return FailureKind.RATE_LIMIT
    return FailureKind.PROVIDER_ERROR


def router_headers(response: Any) -> Mapping[str, Any]:
    """The headers litellm's Router adds to a response (empty when it added none)."""
    hidden = getattr(response, "_hidden_params", None) or {}
    headers = hidden.get("additional_headers") if isinstance(hidden, Mapping) else None
    return headers if isinstance(headers, Mapping) else {}


def attempts_floor(headers: Mapping[str, Any]) -> int:
    """The fewest attempts the headers account for: the answer, plus the retries of the
    answering group and the number of fallback hops litellm reports."""
    retries, hops = (
        headers.get(h) for h in ("x-litellm-attempted-retries", "x-litellm-attempted-fallbacks")
    )
    return 1 + (retries if isinstance(retries, int) else 0) + (hops if isinstance(hops, int) else 0)


def reply_content(response: Any) -> tuple[str | None, FailureKind | None, str | None]:
    """``(text, None, None)``, or ``(None, failure, error)`` for an empty or malformed reply."""
    choices = getattr(response, "choices", None)
    if not choices:
        return None, FailureKind.MALFORMED_REPLY, "response has no choices"
    message = getattr(choices[0], "message", None)
    content = getattr(message, "content", None)
    if content is None or (isinstance(content, str) and not content.strip()):
        return None, FailureKind.EMPTY_REPLY, "empty reply"
    if not isinstance(content, str):
        return (
            None,
            FailureKind.MALFORMED_REPLY,
            f"reply content is {type(content).__name__}, not text",
        )
    return content, None, None


def reply_tokens(
    spec: WorkerSpec, messages: list[dict[str, str]], response: Any, text: str | None
) -> tuple[int, int]:
    """(prompt, completion) tokens: the response's ``usage``, else litellm's count."""
    usage = getattr(response, "usage", None)
    prompt = getattr(usage, "prompt_tokens", None)
    completion = getattr(usage, "completion_tokens", None)
    if isinstance(prompt, int) and isinstance(completion, int) and prompt + completion > 0:
        return prompt, completion
    import litellm

    try:
        prompt = litellm.token_counter(model=spec.model, messages=messages)
    except Exception:
        prompt = 0
    try:
        completion = litellm.token_counter(model=spec.model, text=text) if text else 0
    except Exception:
        completion = 0
    return int(prompt), int(completion)


def reply_cost(
    spec: WorkerSpec,
    response: Any,
    prompt_tokens: int,
    completion_tokens: int,
    warned: set[str],
) -> tuple[float, str]:
    """(dollars, cost source) of one reply. ``warned``: the models already warned about
    having no price (the caller's, so each is named once)."""
    if spec.has_prices:  # configured prices win, by the rule of .pricing
        prompt_price, completion_price = token_prices(spec) or (0.0, 0.0)
        return prompt_tokens * prompt_price + completion_tokens * completion_price, "config"
    # Without them the reply itself is priced rather than its token counts at the map's
    # list price: LiteLLM's completion_cost also reads cached and reasoning tokens.
    import litellm

    try:
        cost = float(litellm.completion_cost(completion_response=response, model=spec.model))
    except Exception as exc:
        cost, reason = 0.0, type(exc).__name__
    else:
        reason = "priced at $0"
    if cost > 0 or prompt_tokens + completion_tokens == 0:
        return cost, "litellm"
    if spec.model not in warned:
        warned.add(spec.model)
        log.warning(
            "litellm has no price for %s (%s); counting $0. Set input_cost_per_token and "
            "output_cost_per_token for worker %r.",
            spec.model,
            reason,
            spec.name,
        )
    return 0.0, "unknown"
