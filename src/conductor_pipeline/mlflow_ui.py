"""``make mlflow``: the MLflow UI on the project's store, offline, on 127.0.0.1, stopped whole.

``mlflow server`` starts uvicorn workers and a job runner with its own consumer processes;
MLflow's GenAI job code imports LiteLLM in them, and LiteLLM fetches its price list from
GitHub on import unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set. Signalling only the
``mlflow`` process leaves the job consumers running. So the server runs in its own process
group with the project's offline variables; SIGINT (Ctrl-C), SIGTERM and SIGHUP stop the
whole group, and what is still alive after the grace period is killed.

    python -m conductor_pipeline.mlflow_ui [--host 127.0.0.1] [--port 5000] [mlflow server options]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from conductor_pipeline.offline import OFFLINE_DEFAULTS
from conductor_pipeline.paths import mlflow_tracking_uri, project_root
from conductor_pipeline.registry import rebase_store
from conductor_pipeline.serving.vllm_process import port_in_use, terminate_process_group

DEFAULT_HOST = "127.0.0.1"  # as conf/base/mlflow.yml's ui section
DEFAULT_PORT = 5000
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def server_command(
    store_uri: str, host: str, port: int, artifacts: Path | None, extra: list[str]
) -> list[str]:
    """The ``mlflow server`` command line; ``extra`` comes last, so it overrides."""
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        store_uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",  # one user, one browser: four uvicorn workers only cost memory
    ]
    if artifacts is not None:
        # artifacts uploaded through the UI land in the project's tree, not ./mlartifacts
        command += ["--artifacts-destination", str(artifacts)]
    return command + extra


def server_env(store_uri: str) -> dict[str, str]:
    """This environment plus the offline defaults (a value already set is kept)."""
    env = dict(os.environ)
    for name, value in OFFLINE_DEFAULTS.items():
        env.setdefault(name, value)
    env["MLFLOW_TRACKING_URI"] = store_uri
    return env


def run_ui(root: Path, host: str, port: int, extra: list[str], grace_s: float = 10.0) -> int:
    """Start the MLflow UI on ``MLFLOW_TRACKING_URI`` (default: the project's store) and wait
    until it exits or a stop signal arrives; then stop its whole process group. Returns the
    server's exit status, 0 when stopped by a signal."""
    ours = mlflow_tracking_uri(root)
    store_uri = os.environ.get("MLFLOW_TRACKING_URI") or ours
    artifacts = None
    if store_uri.rstrip("/") == ours:
        (root / "mlruns").mkdir(parents=True, exist_ok=True)
        rebase_store(root)  # a moved or copied project: show its own artifacts
        artifacts = root / "mlruns" / "artifacts"
    if port_in_use(host, port):
        print(
            f"mlflow UI: port {port} on {host} is in use (another MLflow UI?); choose another "
            f"one: make mlflow ARGS='--port {port + 1}'",
            file=sys.stderr,
        )
        return 1

    stop_requested: list[int] = []

    def request_stop(signum: int, _frame: object) -> None:
        stop_requested.append(signum)

    # installed before the server starts, so that no signal can leave it running unowned
    previous = {sig: signal.signal(sig, request_stop) for sig in STOP_SIGNALS}
    try:
        process = subprocess.Popen(
            server_command(store_uri, host, port, artifacts, extra),
            env=server_env(store_uri),
            cwd=root,
            start_new_session=True,
        )
        print(
            f"MLflow UI: http://{host}:{port}  (store {store_uri}); Ctrl-C stops it",
            flush=True,
        )
        while process.poll() is None and not stop_requested:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.5)
        code = 0 if stop_requested else process.returncode
        # the job consumers outlive a server that exits on its own, too
        terminate_process_group(process, grace_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conductor_pipeline.mlflow_ui",
        description="The MLflow UI on the project's store (MLFLOW_TRACKING_URI wins when set). "
        "Other options go to `mlflow server`.",
    )
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--grace-s", type=float, default=10.0, help="seconds before leftovers are killed"
    )
    args, extra = parser.parse_known_args(argv)
    return run_ui(project_root(), args.host, args.port, extra, grace_s=args.grace_s)


if __name__ == "__main__":
    raise SystemExit(main())
