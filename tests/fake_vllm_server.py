"""A stand-in for `vllm serve` (the OpenAI-compatible server), for tests without a GPU.

Run as the program ``serve BASE [vLLM flags]``: it reads the flags that decide what vLLM
serves — ``--served-model-name`` (the base model's name, default BASE), ``--lora-modules
NAME=PATH ...`` (each adapter under its name; the folder must hold ``adapter_config.json``,
as vLLM requires), ``--host``, ``--port`` — and answers like vLLM does:

- ``GET /health`` 200, ``GET /v1/models`` the served names;
- ``POST /v1/chat/completions`` for a served name: a parseable one-step workflow (the
  scripted rule's text), with usage; for any other name a 404 with vLLM's error shape.

Every chat request's ``model``, with the adapter folder served under that name (``null``
for the base or an unknown name), is appended as one JSON line to the file named by the
environment variable ``FAKE_VLLM_RECORD`` (requests for unknown names too), so a test can
assert which models, and which adapters, were asked for.

Two more environment variables make it misbehave the ways a real server can:
``FAKE_VLLM_UNLISTED`` (comma-separated names) leaves those names out of ``/v1/models``
although it serves them (vLLM that did not load an adapter); ``FAKE_VLLM_GRANDCHILD_PID``
names a file into which it writes the pid of a child process it starts first, one that
outlives it unless its whole process group is stopped (vLLM's engine processes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _flag(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


def _lora_modules(argv: list[str]) -> dict[str, str]:
    if "--lora-modules" not in argv:
        return {}
    modules: dict[str, str] = {}
    for item in argv[argv.index("--lora-modules") + 1 :]:
        if item.startswith("--"):
            break
        name, _, path = item.partition("=")
        if not (Path(path) / "adapter_config.json").is_file():
            sys.exit(f"fake vllm: LoRA {name!r}: no adapter_config.json in {path}")
        modules[name] = path
    if modules and "--enable-lora" not in argv:
        sys.exit("fake vllm: --lora-modules needs --enable-lora")
    return modules


def main(argv: list[str]) -> None:
    if not argv or argv[0] != "serve" or len(argv) < 2:
        sys.exit("usage: fake_vllm_server.py serve BASE_MODEL [flags]")
    base = _flag(argv, "--served-model-name", argv[1])
    adapters = _lora_modules(argv)
    served = {base, *adapters}
    record = os.environ.get("FAKE_VLLM_RECORD")
    host = _flag(argv, "--host", "127.0.0.1")
    port = int(_flag(argv, "--port", "8000"))
    unlisted = set(filter(None, os.environ.get("FAKE_VLLM_UNLISTED", "").split(",")))
    listed = sorted(served - unlisted)
    grandchild_file = os.environ.get("FAKE_VLLM_GRANDCHILD_PID")
    if grandchild_file:
        # lives on when this process exits: only a signal to the whole group reaches it
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.DEVNULL
        )
        Path(grandchild_file).write_text(str(child.pid))

    from conductor_pipeline.workflow.policy import ScriptedPolicy

    rule = ScriptedPolicy(worker=0)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": n} for n in listed]})
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            request = json.loads(self.rfile.read(length) or b"{}")
            model = request.get("model")
            if record:
                with open(record, "a", encoding="utf-8") as out:
                    out.write(json.dumps({"model": model, "adapter": adapters.get(model)}) + "\n")
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": {"message": "not found"}})
                return
            if model not in served:
                self._send(
                    404,
                    {
                        "object": "error",
                        "message": f"The model `{model}` does not exist.",
                        "type": "NotFoundError",
                        "code": 404,
                    },
                )
                return
            text = rule.workflow_text(request.get("messages") or [])
            self._send(
                200,
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": 0,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30},
                },
            )

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer((host, port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
