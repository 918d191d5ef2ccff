"""Nothing the candidate starts outlives the sandbox run, a detached process included: one
that calls ``setsid`` and forks twice leaves the process group the parent kills, and
without a PID namespace (no root) it used to survive the run (issue 28).

Each case runs twice: as this machine allows (root: PID namespace and fresh uid), and in the
unprivileged mode (no namespaces, no fresh uid), which root machines reach only by switching
the kernel layers off. The detached process sleeps under a unique name, which the test then
looks for among every process of the machine.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from conductor_pipeline.tasks import sandbox_setup
from conductor_pipeline.tasks.code_sandbox import run_python

SLEEP = "/bin/sleep"


def _detach(marker: str) -> str:
    """Candidate code: a grandchild in its own session execs ``sleep <marker>``."""
    # The pipe's write end closes at exec (os.pipe is close-on-exec): the read returns
    # once sleep runs, so the run never ends before there is something to outlive it.
    return (
        "import os, time\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.closerange(0, 3)\n"
        f"        os.execv({SLEEP!r}, ['sleep', {marker!r}])\n"
        "    os._exit(0)\n"
        "os.close(w)\n"
        "os.wait()\n"
        "assert os.read(r, 1) == b''\n"
        "print('sleep is running', flush=True)\n"
    )


def _processes_named(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline.split(b"\0") and state != "Z":
            found.append(int(entry))
    return found


@pytest.fixture(params=["as-this-machine-allows", "unprivileged"])
def mode(request, monkeypatch) -> str:
    if request.param == "unprivileged":
        monkeypatch.setattr(sandbox_setup, "_kernel_layers_allowed", lambda: False)
    return request.param


def _marker() -> str:
    # a valid duration for sleep (about 11 days) that no other process carries
    return f"{900000 + uuid.uuid4().int % 99999}.{uuid.uuid4().int % 10**9}"


@pytest.mark.skipif(not os.path.exists(SLEEP), reason=f"{SLEEP} is needed as the detached program")
def test_a_detached_grandchild_does_not_outlive_a_finished_run(mode: str) -> None:
    marker = _marker()
    result = run_python(_detach(marker), allow_subprocesses=True, wall_timeout_s=20)
    try:
        assert result.ok, result
        assert "sleep is running" in result.stdout
        assert _processes_named(marker) == []
        if mode == "unprivileged":
            assert "pidns" not in result.isolation and "uid" not in result.isolation
            assert "reaper" in result.isolation
    finally:
        for pid in _processes_named(marker):
            os.kill(pid, 9)


@pytest.mark.skipif(not os.path.exists(SLEEP), reason=f"{SLEEP} is needed as the detached program")
def test_a_detached_grandchild_does_not_outlive_a_run_cut_at_its_wall_clock(mode: str) -> None:
    marker = _marker()
    code = _detach(marker) + "while True:\n    time.sleep(1)\n"
    result = run_python(code, allow_subprocesses=True, wall_timeout_s=3)
    try:
        assert result.timed_out, result
        assert "sleep is running" in result.stdout
        assert _processes_named(marker) == []
    finally:
        for pid in _processes_named(marker):
            os.kill(pid, 9)
