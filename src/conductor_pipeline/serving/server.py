"""Run the Conductor API: ``conductor serve`` (:func:`serve`) or a server in a background
thread (:class:`BackgroundServer`, for tests, notebooks and the load benchmark).

``serve`` reads the project configuration (``conductor``, ``serving``, ``worker_pool``),
resolves the served model (registry alias or version, adapter folder, or the base policy),
puts a local policy behind the micro-batcher (``serving.batching``), starts the policy
server when it is vLLM, opens the worker pool (starting the sandbox when
the pool is the sandbox), and runs uvicorn until SIGTERM/SIGINT. Uvicorn's shutdown stops
accepting connections and lets requests in flight finish (up to
``serving.shutdown_grace_s``); the pool and the policy server are stopped after that.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from conductor_pipeline.serving.app import create_app
from conductor_pipeline.serving.batching import MicroBatchingPolicy, batched_policy
from conductor_pipeline.serving.logs import configure_json_logging, secret_values
from conductor_pipeline.serving.models import ModelResolutionError, resolve_served_model
from conductor_pipeline.serving.policy_server import PolicyServerError, VllmPolicyServer
from conductor_pipeline.serving.service import ConductorService, Probe
from conductor_pipeline.serving.settings import ServingSettings, serving_settings

log = logging.getLogger(__name__)

API_KEY_ENV = "CONDUCTOR_API_KEY"
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
API_KEY_CREDENTIAL = "conductor_api_key"


class ServeError(RuntimeError):
    """``conductor serve`` cannot start; the message says why and what to do."""


def api_key_from(credentials: dict[str, Any]) -> str | None:
    """The API's bearer key: ``CONDUCTOR_API_KEY`` wins over credentials.yml's
    ``conductor_api_key``; None (no auth) when neither is set."""
    key = os.environ.get(API_KEY_ENV) or credentials.get(API_KEY_CREDENTIAL)
    return str(key) if key else None


def pool_probes(pool: Any) -> list[Probe]:
    """One readiness probe (``GET <api_base>/models``) per distinct worker endpoint; hosted
    providers without an ``api_base`` are not probed (that would cost a call)."""
    by_base: dict[str, list[Any]] = {}
    for spec in getattr(pool, "specs", []):
        if spec.api_base:
            by_base.setdefault(spec.api_base.rstrip("/"), []).append(spec)
    return [
        Probe(
            ",".join(s.name for s in specs),
            f"{base}/models",
            specs[0].api_key.get() if specs[0].api_key else None,
        )
        for base, specs in by_base.items()
    ]


def mlflow_tracer(root: Path, experiment_name: str):
    """A ``tracer(result, tags) -> trace id`` writing to the project's MLflow store
    (``MLFLOW_TRACKING_URI`` wins when set), in experiment ``experiment_name``. An experiment
    created in the project's own store keeps its artifacts under ``mlruns/artifacts``, also
    when ``MLFLOW_TRACKING_URI`` names that store (the Makefile exports it)."""
    import mlflow
    from mlflow import MlflowClient

    from conductor_pipeline.paths import mlflow_tracking_uri
    from conductor_pipeline.tracing import log_orchestration_trace

    ours = mlflow_tracking_uri(root)
    current = os.environ.get("MLFLOW_TRACKING_URI") or ours
    project_store = current.rstrip("/") == ours
    if project_store:
        (root / "mlruns").mkdir(parents=True, exist_ok=True)
        mlflow.set_tracking_uri(mlflow_tracking_uri(root))
    client = MlflowClient()
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is not None:
        experiment_id = experiment.experiment_id
    else:
        location = str(root / "mlruns" / "artifacts") if project_store else None
        experiment_id = client.create_experiment(experiment_name, artifact_location=location)
    lock = threading.Lock()

    def tracer(result, tags: dict[str, str]) -> str:
        with lock:
            return log_orchestration_trace(result, tags=tags, experiment_id=experiment_id)

    return tracer


def served_policy(
    policy_params: dict[str, Any], adapter_dir: Path | None, settings: ServingSettings
) -> Any:
    """The Conductor of ``conductor.policy`` as a server runs it, before any batching."""
    from conductor_pipeline.workflow.config import build_policy

    # conductor.policy.torch_threads (1) keeps evaluation's Conductor off the cores the
    # sandbox worker uses; a server's Conductor takes serving.torch_threads instead (null:
    # every core). On 2 cores, two threads answered a single request 1.8x and 16 concurrent
    # ones 2.3x faster than one thread. Likewise serving.dtype (docs/serving.md, "Precision").
    params = {**policy_params, "torch_threads": settings.torch_threads, "dtype": settings.dtype}
    return build_policy(params, adapter_dir=adapter_dir)


def in_process_policy(
    policy_params: dict[str, Any], adapter_dir: Path | None, settings: ServingSettings
) -> Any:
    """The Conductor of ``conductor.policy`` when no policy server is launched: a local
    model behind the micro-batcher (``serving.batching``: concurrent requests share its
    generation), an endpoint or the scripted rule as they are."""
    return batched_policy(served_policy(policy_params, adapter_dir, settings), settings.batching)


def serving_app(service: ConductorService) -> Any:
    """The API app for ``service``; a micro-batcher in front of its policy learns how many
    requests the app has admitted (its window closes once all of them wait for it)."""
    app = create_app(service)
    if isinstance(service.policy, MicroBatchingPolicy):
        gate = app.state.gate
        service.policy.in_flight = lambda: gate.active
    return app


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {err}") from err
    return sock


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, except for what a SIGTERM/SIGINT does once it has shut down.

        uvicorn re-raises the signal, which would kill the process before the caller stops
        the worker pool (and its sandbox subprocess) and the policy server. Here a signal
        that arrives from then on, e.g. a supervisor repeating SIGTERM, is logged and the
        shutdown goes on (SIGKILL still ends it at once).
        """

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            for sig in _SIGNALS:
                signal.signal(sig, self.handle_exit)
            try:
                yield
            finally:
                for sig in _SIGNALS:
                    signal.signal(sig, _while_stopping)

    return Server


def _while_stopping(sig: int, frame: Any) -> None:
    log.warning("%s received while shutting down; the shutdown goes on", signal.Signals(sig).name)


def uvicorn_config(app: Any, settings: ServingSettings):
    import uvicorn

    return uvicorn.Config(
        app,
        log_config=None,  # records go to our JSON handler
        access_log=False,  # the app writes its own access line per request
        lifespan="on",
        timeout_graceful_shutdown=int(max(settings.shutdown_grace_s, 1)),
        timeout_keep_alive=5,
    )


def serve(
    *,
    env: str | None = None,
    host: str | None = None,
    port: int | None = None,
    model: str | None = None,
    adapter: str | None = None,
    policy_server: str | None = None,
    max_concurrency: int | None = None,
    log_level: int = logging.INFO,
) -> int:
    """``conductor serve``: run the Conductor API in the foreground until a signal."""
    from conductor_pipeline.project import load_project_config
    from conductor_pipeline.workers.runtime import open_worker_pool
    from conductor_pipeline.workflow.config import orchestration_config

    formatter = configure_json_logging(log_level)
    config = load_project_config(env)
    params = dict(config.parameters.get("conductor") or {})
    orchestration = orchestration_config(params)
    settings = serving_settings(config.parameters.get("serving"))
    overrides = {
        "host": host,
        "port": port,
        "policy_server": policy_server,
        "max_concurrency": max_concurrency,
    }
    settings = dataclasses.replace(
        settings, **{k: v for k, v in overrides.items() if v is not None}
    )
    policy_params = dict(params.get("policy") or {})

    api_key = api_key_from(config.credentials)
    if settings.require_api_key and not api_key:
        raise ServeError(
            f"serving.require_api_key is set but no key is configured: set {API_KEY_ENV} or "
            f"`{API_KEY_CREDENTIAL}` in conf/local/credentials.yml"
        )
    worker_keys = [
        os.environ.get(w["api_key_env"], "")
        for w in config.worker_pool.get("workers") or []
        if isinstance(w, dict) and w.get("api_key_env")
    ]
    policy_key_env = policy_params.get("api_key_env")
    formatter.secrets = secret_values(
        config.credentials,
        api_key,
        settings.vllm.api_key(),
        os.environ.get(policy_key_env) if policy_key_env else None,
        worker_keys,
    )

    explicit = bool(model or settings.model)
    reference = model or settings.model or policy_params.get("adapter")
    try:
        served = resolve_served_model(
            reference, adapter_path=adapter, explicit=explicit, root=config.root
        )
    except ModelResolutionError as err:
        raise ServeError(str(err)) from err

    with contextlib.ExitStack() as stack:
        probes: list[Probe] = []
        if settings.policy_server == "vllm":
            launcher = VllmPolicyServer(
                settings.vllm, served.adapter_dir, grace_s=settings.shutdown_grace_s
            )
            try:
                stack.enter_context(launcher)
            except PolicyServerError as err:
                raise ServeError(str(err)) from err
            policy = launcher.policy()
            probes.append(
                Probe("policy", f"{settings.vllm.api_base}/models", settings.vllm.api_key())
            )
        else:
            policy = in_process_policy(policy_params, served.adapter_dir, settings)
            if policy_params.get("kind") == "endpoint":
                key = os.environ.get(policy_key_env) if policy_key_env else None
                probes.append(
                    Probe("policy", f"{policy_params['api_base'].rstrip('/')}/models", key)
                )
            elif policy_params.get("kind") == "scripted" and served.adapter_dir:
                log.warning("the scripted policy ignores the adapter of %s", served.id)
        served = dataclasses.replace(served, policy=policy.name)

        pool = stack.enter_context(
            open_worker_pool(config.worker_pool, config.credentials, root=config.root)
        )
        probes += pool_probes(pool)
        tracer = (
            mlflow_tracer(config.root, settings.tracing_experiment) if settings.tracing else None
        )
        service = ConductorService(
            policy=policy,
            call_worker=pool,
            descriptions=pool.descriptions,
            worker_names=pool.names,
            orchestration=orchestration,
            served=served,
            settings=settings,
            api_key=api_key,
            probes=probes,
            tracer=tracer,
            secrets=list(formatter.secrets),
            root=config.root,
        )
        sock = bind_socket(settings.host, settings.port)
        bound = sock.getsockname()[1]
        print(
            f"Conductor API on http://{settings.host}:{bound}/v1 (model {served.id}, "
            f"policy {policy.name}, auth {'on' if api_key else 'off'})",
            flush=True,
        )
        server = _server_class()(uvicorn_config(serving_app(service), settings))
        server.run(sockets=[sock])
    log.info("stopped")
    _ignore_signals_until_exit()
    return 0


def _ignore_signals_until_exit() -> None:
    """Only the interpreter's exit is left, and Python resets handlers of its own to the
    default there: a repeated SIGTERM would turn exit code 0 into "killed"."""
    if threading.current_thread() is threading.main_thread():
        for sig in _SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


class BackgroundServer:
    """The API for ``service`` on 127.0.0.1 in a daemon thread, for a ``with`` block.

    ``loop`` is the server's event loop (e.g. to count its tasks); exit asks uvicorn to
    shut down gracefully and joins the thread.
    """

    def __init__(self, service: ConductorService, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.app = serving_app(service)
        self.sock = bind_socket(host, port)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn_config(self.app, service.settings))
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="conductor-api", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            await self.server.serve(sockets=[self.sock])

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by __enter__ / the test
            self.error = exc

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the API did not start: {self.error!r}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=60)
        self.sock.close()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until ``/health`` answers 200 (the policy has loaded)."""
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.05)
        raise TimeoutError("the API's policy did not load in time")


def main_error(err: BaseException) -> int:
    """Print a start-up failure for the CLI and return its exit code."""
    print(f"conductor serve: {err}", file=sys.stderr, flush=True)
    return 2
