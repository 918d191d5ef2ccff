"""The sandbox pool server: an OpenAI-compatible chat API on 127.0.0.1.

It serves the simulated workers of ``conf/base/sandbox_workers.yml`` and the real
SmolLM2-135M-Instruct worker, so the pool can reach them through litellm exactly as it
reaches real providers (``model="openai/<name>"``, ``api_base=<base_url>``, any api key).

* :func:`create_app` builds the FastAPI app (used in-process by tests);
* :func:`serve` runs it with uvicorn in this process (``conductor sandbox``);
* :class:`SandboxServer` starts it as a subprocess and stops it again (pipelines, tests).

:func:`create_app` only wires the parts: the endpoints are ``workers.sandbox.handlers``
(functions over one ``AppState``), the real model's loading and batching is
``workers.sandbox.real_workers``, and the request schema is ``workers.chat_request``.
"""

from __future__ import annotations

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
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from conductor_pipeline.tasks.types import Task
from conductor_pipeline.workers.sandbox import handlers
from conductor_pipeline.workers.sandbox.handlers import (
    OWNED_BY_REAL,
    OWNED_BY_SIMULATED,
    AppState,
    SandboxChatRequest,
)
from conductor_pipeline.workers.sandbox.profiles import (
    SandboxProfiles,
    default_profiles_path,
    load_profiles,
    sandbox_pool_config,
)
from conductor_pipeline.workers.sandbox.questions import RECOGNISE_PATH
from conductor_pipeline.workers.sandbox.real_workers import RealWorkers
from conductor_pipeline.workers.sandbox.simulated import SimulatedWorker, TaskIndex

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "OWNED_BY_REAL",
    "OWNED_BY_SIMULATED",
    "AppState",
    "RealWorkers",
    "SandboxChatRequest",
    "SandboxServer",
    "SandboxStartError",
    "create_app",
    "load_tasks",
    "serve",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8600
_OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


# --- the app ------------------------------------------------------------------------------


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
    real_model_concurrency: int = 1,
) -> FastAPI:
    """The sandbox's FastAPI app; its endpoints are ``workers.sandbox.handlers``.

    With ``load_real_model`` the real workers' model loads in a background thread when the
    app starts (``GET /health`` answers 503 until it is ready, and a request to a real worker
    waits for it); without it the app is ready at once and requests to real workers answer
    503.

    ``torch_threads`` caps torch's CPU threads in this process (default 1: the sandbox
    shares its cores with the pipeline, and on an oversubscribed 2-core machine SmolLM2 ran
    5-10x faster with one thread than with two); ``None`` leaves torch's default.
    ``real_max_batch`` caps how many concurrent real-worker requests share one generation;
    ``real_model_concurrency`` is how many such batches generate at once (each on a thread
    of its own with ``torch_threads`` threads, :class:`RealWorkers`).
    """
    if latency_scale < 0:
        raise ValueError("latency_scale must be >= 0")
    index = TaskIndex(tasks)
    state = AppState(
        profiles=profiles,
        index=index,
        sims={p.name: SimulatedWorker(p, index, base_seed=seed) for p in profiles.simulated},
        real=RealWorkers(
            profiles.real,
            model_cache_dir,
            torch_threads,
            real_max_batch,
            concurrency=real_model_concurrency,
        ),
        loading=load_real_model and bool(profiles.real),
        latency_scale=latency_scale,
    )
    if not state.loading:
        state.real.ready.set()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        if state.loading:
            state.real.start_loading()
        yield

    app = FastAPI(title="conductor-pipeline sandbox worker pool", lifespan=lifespan)
    app.state.sandbox = state
    app.state.profiles, app.state.task_index = profiles, index
    app.state.real_workers = state.real
    app.add_api_route("/health", handlers.health, methods=["GET"])
    app.add_api_route(RECOGNISE_PATH, handlers.recognise_question, methods=["POST"])
    app.add_api_route("/v1/models", handlers.models, methods=["GET"])
    app.add_api_route("/v1/chat/completions", handlers.chat_completions, methods=["POST"])
    return app


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
    real_model_concurrency: int = 1,
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
        real_model_concurrency=real_model_concurrency,
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
        real_model_concurrency: int = 1,
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
        self.real_model_concurrency = real_model_concurrency
        self._log_path = Path(log_path) if log_path else None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._port_file: Path | None = None
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

    def start(self, *, wait_for_model: bool = True) -> SandboxServer:
        """Launch the server and wait until it answers. With ``wait_for_model=False`` it
        returns once the server answers while its real model may still be loading, so the
        caller can do its own start-up meanwhile and then call :meth:`wait_until_ready`."""
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
        self._port_file = work / "port"
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
            str(self._port_file),
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
        cmd += ["--real-model-concurrency", str(self.real_model_concurrency)]
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
        self._wait_or_stop(loading_is_enough=not wait_for_model)
        return self

    def wait_until_ready(self) -> None:
        """Block until the started server's real model is loaded (at once without one); a
        model that failed to load raises :class:`SandboxStartError`, and the server stops."""
        if self._process is None:
            raise RuntimeError("sandbox server not started")
        self._wait_or_stop(loading_is_enough=False)

    def watch_model_load(self, on_error: Callable[[str], None], poll_s: float = 0.5) -> None:
        """Call ``on_error`` with the load's error, from a daemon thread, if the real model of
        the started server fails to load. Nothing is called when the load succeeds or the
        server stops first: a caller that went on while the model loads (``start(
        wait_for_model=False)``) learns of the failure when it happens, not at its first call."""
        import httpx

        process = self._process
        if process is None:
            raise RuntimeError("sandbox server not started")
        health = f"{self.url}/health"

        def watch() -> None:
            while self._process is process and process.poll() is None:
                try:
                    status = httpx.get(health, timeout=2.0).json()
                except (httpx.TransportError, ValueError):
                    status = {}
                if status.get("status") == "ok":
                    return
                if status.get("status") == "error":
                    if self._process is process:
                        on_error(str(status.get("detail")))
                    return
                time.sleep(poll_s)

        threading.Thread(target=watch, name="sandbox-model-load-watch", daemon=True).start()

    def _wait_or_stop(self, *, loading_is_enough: bool) -> None:
        try:
            self._wait_until_healthy(loading_is_enough=loading_is_enough)
        except BaseException:
            self.stop()
            raise

    def _log_tail(self, chars: int = 3000) -> str:
        if self._log_path is None or not self._log_path.exists():
            return "(no output)"
        data = self._log_path.read_bytes()[-chars:].decode("utf-8", errors="replace")
        return data.strip() or "(no output)"

    def _wait_until_healthy(self, *, loading_is_enough: bool) -> None:
        import httpx

        assert self._process is not None and self._port_file is not None
        port_file = self._port_file
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
                    if status == "loading" and loading_is_enough:
                        return
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
