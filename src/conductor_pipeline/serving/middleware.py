"""The Conductor API's plumbing: bounded concurrency that refuses instead of queueing
(:class:`Gate`), a stream that frees its slot however it ends (:class:`GuardedStream`), and
the request id and access log line of every request (:class:`RequestLog`)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

access_log = logging.getLogger("conductor_pipeline.serving.access")


class Gate:
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


class GuardedStream(StreamingResponse):
    """A streaming response that runs ``on_close`` however the stream ends."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None], **kwargs: Any):
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[override]
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class RequestLog:
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
