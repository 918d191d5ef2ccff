"""`make mlflow` (conductor_pipeline.mlflow_ui): the real MLflow server on a throw-away project,
stopped with SIGTERM; every process of its group must be gone and LiteLLM must not have
tried to fetch its price list."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conductor_pipeline.mlflow_ui import server_command


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _processes() -> dict[int, tuple[int, int, str, str]]:
    """pid -> (ppid, pgid, state, command line) of every process in /proc."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # exited while we looked
        found[int(stat.parent.name)] = (int(fields[1]), int(fields[2]), fields[0], cmdline)
    return found


def _group(pgid: int) -> dict[int, str]:
    """The live (not zombie) members of process group ``pgid``: pid -> command line."""
    return {
        pid: cmd
        for pid, (_, group, state, cmd) in _processes().items()
        if group == pgid and state != "Z"
    }


def _wait_for(condition, what: str, launcher: subprocess.Popen, log: Path, limit_s: float):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if launcher.poll() is not None:
            pytest.fail(
                f"the launcher exited ({launcher.returncode}) before {what}:\n{log.read_text()}"
            )
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"no {what} within {limit_s} s:\n{log.read_text()[-4000:]}")


def _ui_answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def test_server_command_binds_to_the_given_host_and_passes_extra_options_last(tmp_path):
    command = server_command("sqlite:///x.db", "127.0.0.1", 5001, tmp_path, ["--workers", "2"])
    assert command[1:4] == ["-m", "mlflow", "server"]
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--port") + 1] == "5001"
    assert command[command.index("--artifacts-destination") + 1] == str(tmp_path)
    assert command[-2:] == ["--workers", "2"]  # click keeps the last value: the user's


@pytest.mark.slow  # MLflow's server takes ~20 s to start on two cores
def test_sigterm_stops_every_process_of_the_ui_offline(tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    (root / "pyproject.toml").write_text('[tool.kedro]\npackage_name = "conductor_pipeline"\n')
    env = {
        k: v
        for k, v in os.environ.items()
        # the launcher must set the offline variables itself, and find the store itself
        if k
        not in ("MLFLOW_TRACKING_URI", "LITELLM_LOCAL_MODEL_COST_MAP", "CONDUCTOR_PROJECT_ROOT")
    }
    port = _free_port()
    log = tmp_path / "ui.log"
    with log.open("w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "conductor_pipeline.mlflow_ui", "--port", str(port)],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for(lambda: _ui_answers(port), "HTTP 200 from the UI", launcher, log, 180)

        def server_group() -> int | None:
            for pid, (ppid, pgid, _, _) in _processes().items():
                if ppid == launcher.pid and pgid == pid:
                    return pid
            return None

        pgid = _wait_for(server_group, "server process group", launcher, log, 30)
        # MLflow's job consumers (the processes that import LiteLLM and that a signal to the
        # server alone leaves running) must be up before the stop, for the test to mean anything
        _wait_for(
            lambda: any("huey_consumer" in cmd for cmd in _group(pgid).values()),
            "MLflow job consumer",
            launcher,
            log,
            90,
        )
        assert len(_group(pgid)) > 2

        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=120) == 0, log.read_text()[-4000:]
        assert _group(pgid) == {}, f"left running: {_group(pgid)}"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    text = log.read_text()
    assert "model cost map" not in text and "LiteLLM" not in text, text[-4000:]
    assert (root / "mlruns" / "mlflow.db").is_file()  # the project's store, not ./mlflow.db
    assert not (root / "mlflow.db").exists()


def test_a_busy_port_is_refused_with_the_fix(tmp_path, capsys):
    from conductor_pipeline.mlflow_ui import run_ui

    (tmp_path / "pyproject.toml").write_text('[tool.kedro]\npackage_name = "conductor_pipeline"\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert run_ui(tmp_path, "127.0.0.1", port, []) == 1
    assert f"make mlflow ARGS='--port {port + 1}'" in capsys.readouterr().err
