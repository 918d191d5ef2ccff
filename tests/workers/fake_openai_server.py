"""A tiny OpenAI-compatible chat server for the worker-pool tests.

It listens on 127.0.0.1 only and answers ``POST /v1/chat/completions`` with a deterministic
reply and a ``usage`` block. Tests steer it per model name through ``POST /control``:

``{"model": "sim-a", "mode": M, "times": n, "sleep_s": x}`` where ``M`` is one of ``ok``,
``sleep`` (wait ``sleep_s`` then answer), ``500``, ``429``, ``empty`` (empty content),
``nousage`` (no usage block) or ``401echo`` (a 401 whose message repeats the bearer token,
like a careless provider).

``times`` limits how many requests the mode applies to (then the model answers normally);
omitted means "until told otherwise". ``GET /stats`` returns how many completion requests each
model received, ``POST /reset`` clears modes and counters. The ``Authorization`` header of every
request is kept so tests can check which key reached the server.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time
from collections import Counter
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


class _State:
    def __init__(self) -> None:
        self.modes: dict[str, dict[str, Any]] = {}
        self.calls: Counter[str] = Counter()
        self.auth: list[str] = []

    def reset(self) -> None:
        self.modes.clear()
        self.calls.clear()
        self.auth.clear()

    def take_mode(self, model: str) -> dict[str, Any]:
        mode = self.modes.get(model)
        if not mode:
            return {"mode": "ok"}
        if mode.get("times") is not None:
            mode["times"] -= 1
            if mode["times"] <= 0:
                del self.modes[model]
        return mode


def reply_text(model: str, messages: list[dict[str, Any]]) -> str:
    """The deterministic answer the server gives for a request."""
    last = str(messages[-1].get("content", "")) if messages else ""
    digest = hashlib.sha256(f"{model}|{last}".encode()).hexdigest()[:8]
    return f"[{model}] answer {digest}"


def build_app(state: _State) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/control")
    async def control(body: dict[str, Any]) -> dict[str, str]:
        state.modes[body["model"]] = dict(body)
        return {"status": "ok"}

    @app.post("/reset")
    async def reset() -> dict[str, str]:
        state.reset()
        return {"status": "ok"}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return {"calls": dict(state.calls)}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        model = body.get("model", "")
        messages = body.get("messages", [])
        state.calls[model] += 1
        state.auth.append(request.headers.get("authorization", ""))
        mode = state.take_mode(model)
        kind = mode.get("mode", "ok")
        if kind == "sleep":
            await asyncio.sleep(float(mode.get("sleep_s", 5.0)))
        elif kind == "500":
            return JSONResponse({"error": {"message": "simulated outage"}}, status_code=500)
        elif kind == "401echo":
            auth = request.headers.get("authorization", "")
            return JSONResponse(
                {"error": {"message": f"Incorrect API key provided: {auth}"}}, status_code=401
            )
        elif kind == "429":
            return JSONResponse(
                {"error": {"message": "simulated rate limit", "type": "rate_limit"}},
                status_code=429,
            )
        content = "" if kind == "empty" else reply_text(model, messages)
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages) + 3
        completion_tokens = len(content.split())
        body_out: dict[str, Any] = {
            "id": f"chatcmpl-{state.calls[model]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        if kind == "nousage":
            del body_out["usage"]
        return JSONResponse(body_out)

    return app


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FakeOpenAIServer:
    """Runs the app with uvicorn in a background thread; use as a context manager."""

    def __init__(self, port: int | None = None) -> None:
        self.state = _State()
        self.port = port or free_port()
        config = uvicorn.Config(
            build_app(self.state), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def set_mode(self, model: str, mode: str, times: int | None = None, **extra: Any) -> None:
        self.state.modes[model] = {"mode": mode, "times": times, **extra}

    def calls(self, model: str) -> int:
        return self.state.calls[model]

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake OpenAI server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)
