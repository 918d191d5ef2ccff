"""Parent side of a sandboxed run: start the launcher, watch it, judge what happened.

``execute`` writes the files into a throw-away directory, starts ``sandbox_launcher`` (which
sets up the isolation and runs ``sandbox_harness`` as the candidate's interpreter), reads the
output incrementally under the output cap and the wall clock, kills whatever is left, and
turns the launcher's status events into a ``SandboxResult``. Test verdicts come back on a
separate report pipe and count only when authenticated with the run's key (see
``sandbox_harness`` for what that does and does not defend). What is set up before the
launcher starts is ``sandbox_setup``'s; reading and ending the run, ``sandbox_watch``'s.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import signal
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from conductor_pipeline.tasks.sandbox_setup import (
    SandboxLimits,
    harness_files,
    launch_config,
    start_launcher,
    write_workdir,
)
from conductor_pipeline.tasks.sandbox_watch import Watch, drain, kill_uid, reap, watch_run

__all__ = ["SandboxResult", "execute", "read_report"]


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one sandboxed program.

    ``ok`` means it exited with status 0 within every limit; ``reason`` explains any other
    outcome in words. ``sandbox_error`` marks a failure of the sandbox itself (an
    infrastructure failure, which callers should not blame on the candidate code).
    """

    ok: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    reason: str | None = None
    output_truncated: bool = False
    sandbox_error: bool = False
    duration_s: float = 0.0
    isolation: tuple[str, ...] = ()
    uid: int | None = None

    @property
    def passed(self) -> bool:
        return self.ok


def execute(
    files: dict[str, str],
    runner_args: list[str],
    stdin: str,
    limits: SandboxLimits,
    *,
    want_report: bool,
) -> tuple[SandboxResult, dict[str, Any] | None]:
    """Run the harness in ``runner_args`` mode over ``files``; the report is None unless it
    came from the harness (authenticated with this run's key) and could be read."""
    started = time.monotonic()
    # A fresh key per run: the harness signs its verdict with it (see sandbox_harness).
    key = secrets.token_bytes(32) if want_report else b""
    with tempfile.TemporaryDirectory(prefix="conductor-sandbox-") as tmp:
        workdir = write_workdir(tmp, files, stdin)
        status_r, status_w = os.pipe()
        report_r, report_w = os.pipe() if want_report else (-1, -1)
        key_r, key_w = os.pipe() if want_report else (-1, -1)
        if want_report:
            os.write(key_w, key)  # 32 bytes fit in any pipe buffer: no blocking
            os.close(key_w)
        names = [*files, *harness_files()]
        config = launch_config(workdir, names, runner_args, limits)
        config.update(status_fd=status_w, report_fd=report_w, key_fd=key_r)
        try:
            proc = start_launcher(tmp, config, [status_w, report_w, key_r])
        except BaseException:
            for fd in (status_r, report_r):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            for fd in (status_w, report_w, key_r):
                if fd >= 0:
                    os.close(fd)
        watch = Watch()
        try:
            watch = watch_run(proc, report_r if want_report else None, limits, started)
        finally:
            reap(proc)
            status = drain(status_r)
            os.close(status_r)
            if want_report:
                watch.report_bytes += drain(report_r)
                os.close(report_r)
    events = [
        json.loads(line)
        for line in status.decode("utf-8", "replace").splitlines()
        if line.startswith("{")
    ]
    uid = next((e.get("uid") for e in events if e.get("event") == "isolation"), None)
    layers = next((e.get("layers") for e in events if e.get("event") == "isolation"), [])
    if uid is not None:
        # The PID namespace teardown kills stragglers too, but asynchronously; sweeping the
        # fresh uid makes "nothing is left when we return" hold in every mode.
        kill_uid(uid)
    result = _interpret(proc.returncode, events, watch, limits, started, tuple(layers), uid)
    report = read_report(watch.report_bytes, key) if want_report else None
    return result, report


def read_report(data: bytes, key: bytes) -> dict[str, Any] | None:
    """The harness's report from the bytes of the report pipe, or None.

    Exactly one line, whose MAC (HMAC-SHA256 over the report's JSON text, keyed with this
    run's key) matches: anything else on the pipe (a forged line, a second line, garbage)
    makes the whole report void, so writing to the pipe can only lose a verdict.
    """
    lines = data.decode("utf-8", "replace").splitlines()
    if len(lines) != 1 or not key:
        return None
    try:
        envelope = json.loads(lines[0])
        body, mac = envelope["report"], envelope["mac"]
        if not isinstance(body, str) or not isinstance(mac, str):
            return None
        expected = hmac.new(key, body.encode("utf-8"), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, mac):
            return None
        report = json.loads(body)
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
    return report if isinstance(report, dict) else None


def _interpret(
    launcher_rc: int | None,
    events: list[dict[str, Any]],
    watch: Watch,
    limits: SandboxLimits,
    started: float,
    layers: tuple[str, ...],
    uid: int | None,
) -> SandboxResult:
    cap = int(limits.max_output_bytes)
    stdout = bytes(watch.stdout[:cap]).decode("utf-8", "replace")
    stderr = bytes(watch.stderr[:cap]).decode("utf-8", "replace")
    common = {
        "stdout": stdout,
        "stderr": stderr,
        "output_truncated": watch.overflow,
        "duration_s": round(time.monotonic() - started, 4),
        "isolation": layers,
        "uid": uid,
    }
    setup_error = next((e["message"] for e in events if e.get("event") == "setup_error"), None)
    finished = next((e for e in events if e.get("event") == "exit"), None)
    if watch.timed_out:
        return SandboxResult(
            ok=False,
            returncode=None,
            timed_out=True,
            reason=f"timed out after {limits.wall_timeout_s:g} s",
            **common,
        )
    if watch.overflow:
        return SandboxResult(
            ok=False, returncode=None, reason=f"output exceeded {cap} bytes", **common
        )
    if setup_error is not None:
        return SandboxResult(
            ok=False,
            returncode=None,
            reason=f"sandbox error: {setup_error}",
            sandbox_error=True,
            **common,
        )
    if finished is None:
        tail = _last_line(stderr)
        why = f"sandbox error: launcher ended with code {launcher_rc}" + (
            f": {tail}" if tail else ""
        )
        return SandboxResult(ok=False, returncode=None, reason=why, sandbox_error=True, **common)
    if finished.get("signal"):
        signum = int(finished["signal"])
        return SandboxResult(
            ok=False, returncode=-signum, reason=_signal_reason(signum, limits), **common
        )
    rc = int(finished.get("returncode", 1))
    if rc == 0:
        return SandboxResult(ok=True, returncode=0, **common)
    tail = _last_line(stderr)
    if tail.startswith("MemoryError") or tail.endswith("MemoryError"):
        return SandboxResult(
            ok=False,
            returncode=rc,
            reason=f"memory limit exceeded ({limits.memory_mb} MB)",
            **common,
        )
    return SandboxResult(
        ok=False,
        returncode=rc,
        reason=f"exited with code {rc}" + (f": {tail}" if tail else ""),
        **common,
    )


def _signal_reason(signum: int, limits: SandboxLimits) -> str:
    if signum == signal.SIGXCPU:
        return f"CPU time limit exceeded ({limits.cpu_time_s} s)"
    if signum == signal.SIGXFSZ:
        return f"file size limit exceeded ({limits.disk_mb} MB)"
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = str(signum)
    if signum == signal.SIGKILL:
        return "killed by SIGKILL (CPU or memory limit)"
    return f"killed by signal {name}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
