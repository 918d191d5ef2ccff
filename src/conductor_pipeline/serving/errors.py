"""The Conductor API's error: answered in OpenAI's shape."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with its
    status and headers; ``extra`` adds top-level fields (the ``conductor`` record of a 502)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.code, self.param, self.headers, self.extra = code, param, headers, extra

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return {"error": error, **(self.extra or {})}
