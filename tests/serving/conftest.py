"""Fixtures for the Conductor API tests: a throw-away project on the sandbox, ``conductor
serve`` as a real subprocess, and an in-process server over a fake pool."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
import yaml

from conductor_pipeline.tasks import Task

REPO = Path(__file__).resolve().parents[2]
QUESTION = "Compute the sum of 1234 and 4321 and give the number."
API_KEY = "sk-conductor-canary-6d1f0a4e9b"
_LOOPBACK = {"127.0.0.1", "::1", "localhost"}


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test here that opens a TCP connection to anything but loopback."""
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> None:
        if isinstance(address, tuple) and address[0] not in _LOOPBACK:
            raise ConnectionRefusedError(f"test tried to reach {address!r} (loopback only)")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


def make_project(
    root: Path,
    *,
    policy: dict[str, Any] | None = None,
    conductor: dict[str, Any] | None = None,
    serving: dict[str, Any] | None = None,
    sandbox: dict[str, Any] | None = None,
    cache_mode: str = "read_write",
    credentials: dict[str, Any] | None = None,
) -> Path:
    """A project folder with the base configuration, one prepared task per split, a small
    sandbox (no real model, no simulated latency unless given) and the scripted policy."""
    (root / "conf" / "local").mkdir(parents=True)
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copytree(REPO / "conf" / "base", root / "conf" / "base")
    splits = root / "data" / "05_model_input"
    splits.mkdir(parents=True)
    for name in ("train", "validation", "test"):
        task = Task(f"t/{name}", "math", "easy", QUESTION, "5555", "number", "numeric", "unit")
        pd.DataFrame([task.to_record()]).to_parquet(splits / f"{name}_tasks.parquet")
    pool = yaml.safe_load((REPO / "conf/base/workers.yml").read_text())
    pool["worker_pool"]["sandbox"].update(
        load_real_model=False, latency_scale=0.0, workers=["sim-sage", "sim-abacus"]
    )
    pool["worker_pool"]["sandbox"].update(sandbox or {})
    pool["worker_pool"]["cache"]["mode"] = cache_mode
    (root / "conf" / "local" / "workers.yml").write_text(yaml.safe_dump(pool))
    params = yaml.safe_load((REPO / "conf/base/parameters_conductor.yml").read_text())
    params["conductor"]["policy"] = policy or {"kind": "scripted", "worker": 1, "adapter": None}
    params["conductor"].update(conductor or {})
    (root / "conf" / "local" / "parameters_conductor.yml").write_text(yaml.safe_dump(params))
    if serving:
        (root / "conf" / "local" / "parameters_serving.yml").write_text(
            yaml.safe_dump({"serving": serving})
        )
    if credentials:
        (root / "conf" / "local" / "credentials.yml").write_text(yaml.safe_dump(credentials))
    return root


class ServeProcess:
    """``conductor serve`` in a subprocess: its URL, its output, SIGTERM."""

    def __init__(self, project: Path, args: list[str], env: dict[str, str]) -> None:
        self.project = project
        self.args = args
        self.env = env
        self.process: subprocess.Popen[str] | None = None
        self.url: str | None = None
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._readers: list[threading.Thread] = []

    def _pump(self, stream, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)

    def start(self, timeout_s: float = 180.0) -> ServeProcess:
        cmd = [sys.executable, "-m", "conductor_pipeline.cli", "serve", "--port", "0", *self.args]
        self.process = subprocess.Popen(
            cmd,
            cwd=self.project,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for stream, sink in (
            (self.process.stdout, self.stdout),
            (self.process.stderr, self.stderr),
        ):
            reader = threading.Thread(target=self._pump, args=(stream, sink), daemon=True)
            reader.start()
            self._readers.append(reader)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.wait_output()
                raise RuntimeError(f"conductor serve exited early:\n{self.output}")
            line = next((s for s in self.stdout if "Conductor API on " in s), None)
            if line and self.url is None:
                self.url = line.split("Conductor API on ", 1)[1].split()[0].removesuffix("/v1")
            if self.url:
                try:
                    if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"conductor serve not healthy in {timeout_s} s:\n{self.output}")

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def output(self) -> str:
        return "".join(self.stdout) + "".join(self.stderr)

    def wait_output(self) -> None:
        for reader in self._readers:
            reader.join(timeout=10)

    def terminate(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    def terminate_until_exit(self, every_s: float = 0.01, timeout_s: float = 60.0) -> int:
        """Send SIGTERM again and again until the process exits; its exit code."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None:
            assert time.monotonic() < deadline, "conductor serve did not exit"
            self.process.send_signal(signal.SIGTERM)
            time.sleep(every_s)
        self.wait_output()
        return self.process.returncode

    def stop(self, timeout_s: float = 60.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.wait_output()
        return self.process.returncode


def serve_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CONDUCTOR_API_KEY"}
    env.update(
        MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'serve-mlflow.db'}",
        PYTHONUNBUFFERED="1",
    )
    env.pop("CONDUCTOR_PROJECT_ROOT", None)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[ServeProcess]:
    """One ``conductor serve`` on the sandbox (scripted policy, auth on) for a module."""
    tmp = tmp_path_factory.mktemp("served")
    project = make_project(tmp / "project", serving={"tracing": True})
    process = ServeProcess(project, [], serve_env(tmp, CONDUCTOR_API_KEY=API_KEY))
    process.start()
    yield process
    process.stop()
