"""The sandbox pool server: an OpenAI-compatible chat API on 127.0.0.1.

It serves the simulated workers of ``conf/base/sandbox_workers.yml`` and the real
SmolLM2-135M-Instruct worker, so the pool can reach them through litellm exactly as it
reaches real providers (``model="openai/<name>"``, ``api_base=<base_url>``, any api key).

* :func:`create_app` builds the FastAPI app (used in-process by tests);
* :func:`serve` runs it with uvicorn in this process (``conductor sandbox``);
* :class:`SandboxServer` starts it as a subprocess and stops it again (pipelines, tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from conductor_pipeline.tasks.types import Task
from conductor_pipeline.workers.chat_request import (
    ChatRequest,
    Int64,
    RequestError,
    load_json_body,
    validate_request,
)
from conductor_pipeline.workers.sandbox.profiles import (
    RealProfile,
    SandboxProfiles,
    default_profiles_path,
    load_profiles,
    sandbox_pool_config,
)
from conductor_pipeline.workers.sandbox.questions import RECOGNISE_PATH, recognise
from conductor_pipeline.workers.sandbox.simulated import SimulatedWorker, TaskIndex, message_text

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8600
OWNED_BY_SIMULATED = "sandbox-simulated"
OWNED_BY_REAL = "sandbox-local"
_OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


# --- request schema -----------------------------------------------------------------------


class _ChatRequest(ChatRequest):
    """The shared OpenAI chat request (``workers.chat_request``) with sampling bounds."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0, allow_inf_nan=False)
    max_tokens: Int64 | None = Field(default=None, ge=1)
    max_completion_tokens: Int64 | None = Field(default=None, ge=1)
    n: Int64 | None = Field(default=1, ge=1)


def _error(
    status: int, message: str, *, kind: str, code: str | None = None, param: str | None = None
) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(status_code=status, content=body)


# --- the app ------------------------------------------------------------------------------


class _RealWorkers:
    """Loads SmolLM2 in a background thread and answers its requests in batches.

    Requests that arrive while a batch is generating wait for the next one (at most
    ``max_batch`` rows), so concurrent callers share the model's forward passes: on two CPU
    cores a batch of 8 replies costs about as much as 2-3 single ones. Each row keeps its own
    seed, temperature and token limit (``generate_chat_batch``).
    """

    def __init__(
        self,
        profiles: Sequence[RealProfile],
        cache_dir: Path | None,
        torch_threads: int | None,
        max_batch: int = 8,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.profiles = {p.name: p for p in profiles}
        self.cache_dir = cache_dir
        self.torch_threads = torch_threads
        self.max_batch = max_batch
        self.model: Any = None
        self.tokenizer: Any = None
        self.error: str | None = None
        self.ready = threading.Event()
        self.load_seconds: float | None = None
        self.batch_sizes: list[int] = []  # one entry per generate call, for tests and /health
        self._pending: list[tuple[list[dict[str, Any]], int, float, int, Future]] = []
        self._wakeup = threading.Condition()
        self._thread: threading.Thread | None = None
        self._batcher: threading.Thread | None = None

    def start_loading(self) -> None:
        if self._thread is None and not self.ready.is_set():
            self._thread = threading.Thread(
                target=self._load, name="sandbox-model-load", daemon=True
            )
            self._thread.start()

    def _load(self) -> None:
        from conductor_pipeline.workers.local_model import load_smollm2

        started = time.perf_counter()
        try:
            self._set_threads()
            self.model, self.tokenizer = load_smollm2(self.cache_dir)
            self.load_seconds = time.perf_counter() - started
            log.info("sandbox: SmolLM2 loaded in %.1f s", self.load_seconds)
        except Exception as exc:  # reported through /health
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("sandbox: loading SmolLM2 failed")
        finally:
            self.ready.set()

    def submit(
        self, messages: list[dict[str, Any]], max_new_tokens: int, temperature: float, seed: int
    ) -> Future:
        """Queue one reply; the future resolves to ``(text, prompt_tokens, completion_tokens)``."""
        future: Future = Future()
        with self._wakeup:
            if self._batcher is None:
                self._batcher = threading.Thread(
                    target=self._serve_batches, name="sandbox-model-batches", daemon=True
                )
                self._batcher.start()
            self._pending.append((messages, max_new_tokens, temperature, seed, future))
            self._wakeup.notify()
        return future

    def _serve_batches(self) -> None:
        from conductor_pipeline.workers.local_model import generate_chat_batch

        self._set_threads()
        while True:
            with self._wakeup:
                while not self._pending:
                    self._wakeup.wait()
                batch = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
            try:
                replies = generate_chat_batch(
                    self.model,
                    self.tokenizer,
                    [b[0] for b in batch],
                    [b[1] for b in batch],
                    [b[2] for b in batch],
                    [b[3] for b in batch],
                )
            except Exception as exc:  # each waiting request gets the error, the loop goes on
                log.exception("sandbox: SmolLM2 generation failed for a batch of %d", len(batch))
                for *_, future in batch:
                    future.set_exception(exc)
                continue
            self.batch_sizes.append(len(batch))
            for (*_, future), reply in zip(batch, replies, strict=True):
                future.set_result(reply)

    def _set_threads(self) -> None:
        # Per calling thread: OpenMP keeps the thread count per thread, and generation runs
        # in its own thread.
        if self.torch_threads:
            import torch

            torch.set_num_threads(self.torch_threads)


def create_app(
    profiles: SandboxProfiles,
    tasks: Iterable[Task],
    *,
    seed: int = 0,
    latency_scale: float = 1.0,
    load_real_model: bool = True,
    model_cache_dir: Path | None = None,
    torch_threads: int | None = 1,
    real_max_batch: int = 8,
) -> FastAPI:
    """The sandbox's FastAPI app.

    With ``load_real_model`` the real workers' model loads in a background thread when the
    app starts (``GET /health`` answers 503 until it is ready); without it the app is ready
    at once and requests to real workers answer 503.

    ``torch_threads`` caps torch's CPU threads in this process (default 1: the sandbox
    shares its cores with the pipeline, and on an oversubscribed 2-core machine SmolLM2 ran
    5-10x faster with one thread than with two); ``None`` leaves torch's default.
    ``real_max_batch`` caps how many concurrent real-worker requests share one generation.
    """
    if latency_scale < 0:
        raise ValueError("latency_scale must be >= 0")
    index = TaskIndex(tasks)
    sims = {p.name: SimulatedWorker(p, index, base_seed=seed) for p in profiles.simulated}
    real = _RealWorkers(profiles.real, model_cache_dir, torch_threads, real_max_batch)
    loading = load_real_model and bool(profiles.real)
    if not loading:
        real.ready.set()
    started_at = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        if loading:
            real.start_loading()
        yield

    app = FastAPI(title="conductor-pipeline sandbox worker pool", lifespan=lifespan)
    app.state.profiles = profiles
    app.state.task_index = index
    app.state.real_workers = real

    @app.get("/health")
    async def health() -> JSONResponse:
        if not real.ready.is_set():
            return JSONResponse(status_code=503, content={"status": "loading"})
        if loading and real.error:
            return JSONResponse(status_code=503, content={"status": "error", "detail": real.error})
        return JSONResponse(
            content={
                "status": "ok",
                "workers": profiles.names,
                "tasks": len(index),
                "real_model_loaded": real.model is not None,
                # generate calls of the real model and the largest batch one of them served
                "real_model_batches": len(real.batch_sizes),
                "real_model_max_batch": max(real.batch_sizes, default=0),
            }
        )

    @app.post(RECOGNISE_PATH)
    async def recognise_question(request: Request) -> JSONResponse:
        # Not part of the OpenAI API: lets a client warn that the simulated workers will
        # make up an answer to a question that is none of the prepared tasks.
        try:
            raw = load_json_body(await request.body())
        except RequestError as err:
            return _error(400, err.message, kind="invalid_request_error", code=err.code)
        text = raw.get("text") if isinstance(raw, dict) else None
        if not isinstance(text, str):
            return _error(
                400,
                'expected a JSON object {"text": "<question>"}',
                kind="invalid_request_error",
                param="text",
            )
        return JSONResponse(content={**recognise(index, text).to_dict(), "tasks": len(index)})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = [
            {
                "id": p.name,
                "object": "model",
                "created": started_at,
                "owned_by": OWNED_BY_SIMULATED,
                "description": p.description,
            }
            for p in profiles.simulated
        ] + [
            {
                "id": p.name,
                "object": "model",
                "created": started_at,
                "owned_by": OWNED_BY_REAL,
                "description": p.description,
            }
            for p in profiles.real
        ]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> JSONResponse:
        try:
            body = validate_request(load_json_body(await request.body()), _ChatRequest)
        except RequestError as err:
            return _error(
                400, err.message, kind="invalid_request_error", param=err.param, code=err.code
            )
        if body.stream:
            return _error(
                400,
                "streaming is not supported by the sandbox worker server; send stream=false",
                kind="invalid_request_error",
                param="stream",
                code="stream_not_supported",
            )
        if (body.n or 1) != 1:
            return _error(
                400,
                "the sandbox returns one choice per request; send n=1",
                kind="invalid_request_error",
                param="n",
            )
        messages = [m.model_dump() for m in body.messages]
        temperature = 1.0 if body.temperature is None else body.temperature
        request_seed = body.seed if body.seed is not None else 0
        max_tokens = body.max_completion_tokens or body.max_tokens

        if body.model in sims:
            worker = sims[body.model]
            reply = worker.respond(
                messages, seed=request_seed, temperature=temperature, max_tokens=max_tokens
            )
            if latency_scale > 0 and reply.latency_s > 0:
                await asyncio.sleep(reply.latency_s * latency_scale)
            return _completion(
                body.model,
                reply.text,
                reply.prompt_tokens,
                reply.completion_tokens,
                reply.finish_reason,
                simulated=True,
            )

        if body.model in real.profiles:
            profile = real.profiles[body.model]
            if not real.ready.is_set() or real.model is None:
                if real.error:
                    reason = real.error
                elif not real.ready.is_set():
                    reason = "the model is still loading"
                else:
                    reason = "the server was started without the real model"
                return _error(
                    503,
                    f"worker {body.model!r} is unavailable: {reason}",
                    kind="service_unavailable",
                    code="model_unavailable",
                )
            limit = min(max_tokens or profile.max_tokens, profile.max_tokens)
            chat = [{"role": m["role"], "content": message_text(m)} for m in messages]
            text, prompt_tokens, completion_tokens = await asyncio.wrap_future(
                real.submit(chat, limit, temperature, request_seed)
            )
            finish = "length" if completion_tokens >= limit else "stop"
            return _completion(
                body.model, text, prompt_tokens, completion_tokens, finish, simulated=False
            )

        known = ", ".join(profiles.names)
        return _error(
            404,
            f"The model {body.model!r} does not exist in the sandbox pool (available: {known})",
            kind="invalid_request_error",
            param="model",
            code="model_not_found",
        )

    return app


def _completion(
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


# --- tasks from files ---------------------------------------------------------------------


def load_tasks(paths: Iterable[str | Path]) -> list[Task]:
    """Task records from ``.jsonl``, ``.json`` (a list of records) or ``.parquet`` files."""
    tasks: list[Task] = []
    for path in map(Path, paths):
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            with path.open(encoding="utf-8") as handle:
                rows = [json.loads(line) for line in handle if line.strip()]
        elif suffix == ".json":
            rows = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(rows, list):
                raise ValueError(f"{path}: expected a JSON list of task records")
        elif suffix in (".parquet", ".pq"):
            import pandas as pd

            rows = pd.read_parquet(path).to_dict(orient="records")
        else:
            raise ValueError(
                f"{path}: unsupported task file type {suffix!r} (use .jsonl, .json or .parquet)"
            )
        for i, row in enumerate(rows):
            try:
                tasks.append(Task.from_record(row))
            except (KeyError, ValueError, TypeError) as exc:
                raise ValueError(f"{path}: row {i} is not a valid task record: {exc}") from exc
    return tasks


# --- running the server -------------------------------------------------------------------


def serve(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    tasks_paths: Sequence[str | Path] | str | Path | None = None,
    tasks: Iterable[Task] | None = None,
    profiles_path: str | Path | None = None,
    seed: int = 0,
    latency_scale: float = 1.0,
    load_real_model: bool = True,
    model_cache_dir: str | Path | None = None,
    port_file: str | Path | None = None,
    log_level: str = "warning",
    torch_threads: int | None = 1,
    parent_pid: int | None = None,
) -> None:
    """Run the sandbox server in this process until interrupted (or, with ``parent_pid``,
    until that process is gone).

    ``port=0`` binds a free port; its number is written to ``port_file`` when given (the
    file appears once the socket is bound, before the model has loaded).
    """
    import uvicorn

    if isinstance(tasks_paths, str | Path):
        tasks_paths = [tasks_paths]
    task_list = list(tasks or [])
    if tasks_paths:
        task_list += load_tasks(tasks_paths)
    if not task_list:
        log.warning("sandbox: no tasks loaded; simulated workers will recognise no question")
    profiles = load_profiles(profiles_path or default_profiles_path())
    app = create_app(
        profiles,
        task_list,
        seed=seed,
        latency_scale=latency_scale,
        load_real_model=load_real_model,
        model_cache_dir=Path(model_cache_dir) if model_cache_dir else None,
        torch_threads=torch_threads,
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    if port_file:
        target = Path(port_file)
        partial = target.with_name(target.name + ".part")
        partial.write_text(str(bound_port))
        os.replace(partial, target)
    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="on")
    if parent_pid:
        _exit_with_parent(parent_pid)
    uvicorn.Server(config).run(sockets=[sock])


def _exit_with_parent(parent_pid: int, period_s: float = 1.0) -> None:
    """Shut the server down (gracefully, by SIGTERM) once the process that started it is gone.

    The server runs in a session of its own, so that a terminal's Ctrl-C reaches only the
    parent, which then stops it in order; this watch covers a parent killed outright.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(period_s)
        log.warning("sandbox: parent process %d is gone; shutting down", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="sandbox-parent-watch", daemon=True).start()


class SandboxStartError(RuntimeError):
    """The sandbox server subprocess did not become healthy."""


class SandboxServer:
    """Runs the sandbox server as a subprocess for the duration of a ``with`` block.

    >>> with SandboxServer(tasks_paths=["data/05_model_input/test.jsonl"]) as sandbox:
    ...     pool = sandbox.pool_config()      # worker entries pointing at sandbox.base_url

    ``port=0`` (default) picks a free port. Start-up waits for ``GET /health`` (the real
    model loads first) and raises :class:`SandboxStartError` with the tail of the
    subprocess's log on failure or timeout. Exit sends SIGTERM, then SIGKILL.
    """

    def __init__(
        self,
        *,
        tasks_paths: Sequence[str | Path] | str | Path | None = None,
        tasks: Iterable[Task] | None = None,
        profiles_path: str | Path | None = None,
        seed: int = 0,
        latency_scale: float = 1.0,
        host: str = DEFAULT_HOST,
        port: int = 0,
        load_real_model: bool = True,
        model_cache_dir: str | Path | None = None,
        startup_timeout_s: float = 300.0,
        log_path: str | Path | None = None,
        torch_threads: int | None = 1,
    ) -> None:
        if isinstance(tasks_paths, str | Path):
            tasks_paths = [tasks_paths]
        self._tasks_paths = [Path(p) for p in tasks_paths or []]
        self._tasks = list(tasks) if tasks is not None else None
        self.profiles_path = Path(profiles_path) if profiles_path else default_profiles_path()
        self.seed = seed
        self.latency_scale = latency_scale
        self.host = host
        self.port = port
        self.load_real_model = load_real_model
        self.model_cache_dir = model_cache_dir
        self.startup_timeout_s = startup_timeout_s
        self.torch_threads = torch_threads
        self._log_path = Path(log_path) if log_path else None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_handle: Any = None
        self.last_log = ""  # the subprocess's output, kept after stop() removes its folder

    # -- addresses --

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-style API base, ``http://127.0.0.1:<port>/v1``."""
        return f"{self.url}/v1"

    def pool_config(self) -> list[dict[str, Any]]:
        """The pool's worker entries for this server (see ``sandbox_pool_config``)."""
        return sandbox_pool_config(load_profiles(self.profiles_path), self.base_url)

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    # -- lifecycle --

    def __enter__(self) -> SandboxServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> SandboxServer:
        if self._process is not None:
            raise RuntimeError("sandbox server already started")
        self._workdir = tempfile.TemporaryDirectory(prefix="conductor-sandbox-")
        work = Path(self._workdir.name)
        paths = list(self._tasks_paths)
        if self._tasks is not None:
            inline = work / "tasks.jsonl"
            with inline.open("w", encoding="utf-8") as handle:
                for task in self._tasks:
                    handle.write(json.dumps(task.to_record()) + "\n")
            paths.append(inline)
        port_file = work / "port"
        if self._log_path is None:
            self._log_path = work / "server.log"
        cmd = [
            sys.executable,
            "-m",
            "conductor_pipeline.workers.sandbox",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--port-file",
            str(port_file),
            "--profiles",
            str(self.profiles_path),
            "--seed",
            str(self.seed),
            "--latency-scale",
            str(self.latency_scale),
        ]
        for path in paths:
            cmd += ["--tasks", str(path)]
        if not self.load_real_model:
            cmd.append("--no-real-model")
        if self.model_cache_dir:
            cmd += ["--model-cache", str(self.model_cache_dir)]
        cmd += ["--torch-threads", str(self.torch_threads or 0), "--parent-pid", str(os.getpid())]
        env = {**os.environ, **_OFFLINE_ENV, "PYTHONUNBUFFERED": "1"}
        self._log_handle = open(self._log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._process = subprocess.Popen(
            cmd,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # Ctrl-C goes to the parent, which stops us in order
        )
        try:
            self._wait_until_healthy(port_file)
        except BaseException:
            self.stop()
            raise
        return self

    def _log_tail(self, chars: int = 3000) -> str:
        if self._log_path is None or not self._log_path.exists():
            return "(no output)"
        data = self._log_path.read_bytes()[-chars:].decode("utf-8", errors="replace")
        return data.strip() or "(no output)"

    def _wait_until_healthy(self, port_file: Path) -> None:
        import httpx

        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        status = "not started"
        while time.monotonic() < deadline:
            code = self._process.poll()
            if code is not None:
                raise SandboxStartError(
                    f"sandbox server exited with code {code} during start-up; its output ends with:\n{self._log_tail()}"
                )
            if port_file.exists():
                self.port = int(port_file.read_text().strip())
                try:
                    response = httpx.get(f"{self.url}/health", timeout=2.0)
                    if response.status_code == 200:
                        return
                    payload = response.json()
                    status = payload.get("status", str(response.status_code))
                    if status == "error":
                        raise SandboxStartError(
                            f"sandbox server failed to load its real model: {payload.get('detail')}\n"
                            f"its output ends with:\n{self._log_tail()}"
                        )
                except (httpx.TransportError, ValueError):
                    status = "not answering"
            time.sleep(0.2)
        raise SandboxStartError(
            f"sandbox server not healthy after {self.startup_timeout_s:.0f} s (last status: {status}); "
            f"its output ends with:\n{self._log_tail()}"
        )

    def stop(self, grace_s: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=grace_s)
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        if self._workdir is not None:
            if self._log_path is not None and Path(self._workdir.name) in self._log_path.parents:
                self.last_log = self._log_tail(20000)
                self._log_path = None
            self._workdir.cleanup()
            self._workdir = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None
