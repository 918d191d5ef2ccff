"""What one worker call returns: a reply or a typed failure, always with its usage."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Protocol


class FailureKind(StrEnum):
    """Why a call produced no usable reply. None of these is a wrong answer."""

    TIMEOUT = "timeout"
    RATE_LIMIT = "rate_limit"
    PROVIDER_ERROR = "provider_error"
    EMPTY_REPLY = "empty_reply"
    MALFORMED_REPLY = "malformed_reply"


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    cache_hit: bool = False

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class WorkerReply:
    """The outcome of one call to one worker.

    Exactly one of ``text`` and ``failure`` is set. ``error`` is a human-readable message
    for failures (never containing credentials). ``attempts`` counts tries including
    retries; ``served_by`` names the deployment that answered when a fallback was used.
    """

    worker: str
    text: str | None
    usage: Usage = field(default_factory=Usage)
    failure: FailureKind | None = None
    error: str | None = None
    attempts: int = 1
    served_by: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None

    def to_record(self) -> dict[str, Any]:
        row = asdict(self)
        row["failure"] = self.failure.value if self.failure else None
        return row


class WorkerCaller(Protocol):
    """The one thing the workflow executor needs from a pool.

    ``worker`` is the worker's position in the pool (the number the Conductor sees);
    ``sample_index`` distinguishes repeated samples of the same request in the cache.
    ``overrides`` are completion options for this call; the executor sends ``max_tokens``
    (at most the worker's own cap) when a token or dollar budget limits the call, and
    nothing otherwise. A caller honours ``max_tokens`` as the most completion tokens to
    generate.
    """

    async def __call__(
        self,
        worker: int,
        messages: list[dict[str, str]],
        sample_index: int = 0,
        **overrides: Any,
    ) -> WorkerReply: ...
