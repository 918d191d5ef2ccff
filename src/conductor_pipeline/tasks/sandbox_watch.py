"""Watching a launched sandboxed run from the parent: read its output incrementally under
the output cap and the wall clock, then kill whatever is left of it (its process tree, its
process group, every process of its fresh uid) and collect the launcher."""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass, field

from conductor_pipeline.tasks.sandbox_launcher import end_descendants, proc_files
from conductor_pipeline.tasks.sandbox_setup import SandboxLimits

__all__ = ["Watch", "drain", "kill_uid", "reap", "watch_run"]


@dataclass
class Watch:
    """What the parent saw of a run: its output and report bytes, and whether the wall
    clock or the output cap cut it short."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    report_bytes: bytes = b""
    timed_out: bool = False
    overflow: bool = False


def watch_run(
    proc: subprocess.Popen[bytes], report_fd: int | None, limits: SandboxLimits, started: float
) -> Watch:
    """Read the child's output incrementally until it ends, overflows or runs out of time."""
    watch = Watch()
    cap = int(limits.max_output_bytes)
    deadline = started + float(limits.wall_timeout_s)
    assert proc.stdout is not None and proc.stderr is not None
    buffers = {proc.stdout.fileno(): watch.stdout, proc.stderr.fileno(): watch.stderr}
    report = bytearray()
    sel = selectors.DefaultSelector()
    for fd in buffers:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    if report_fd is not None:
        os.set_blocking(report_fd, False)
        sel.register(report_fd, selectors.EVENT_READ)
    exited_at: float | None = None
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                watch.timed_out = True
                break
            if exited_at is None and _has_exited(proc.pid):
                exited_at = now
            # Done once the launcher has exited and its pipes are drained. Without a PID
            # namespace an orphan may hold the pipes open after the launcher is gone; give
            # it a moment to flush, then stop waiting for it.
            if exited_at is not None and (not sel.get_map() or now - exited_at > 0.2):
                break
            if not sel.get_map():
                # The child closed its output but still runs: poll for its end.
                time.sleep(min(deadline - now, 0.005))
                continue
            for key, _ in sel.select(timeout=min(deadline - now, 0.05 if exited_at else 0.25)):
                fd = key.fd
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                if fd == report_fd:
                    report += chunk[: 1_000_000 - len(report)]
                    continue
                buf = buffers[fd]
                buf += chunk[: cap + 1 - len(buf)]
                if len(buf) > cap:
                    watch.overflow = True
            if watch.overflow:
                break
    finally:
        sel.close()
    watch.report_bytes = bytes(report)
    return watch


def _has_exited(pid: int) -> bool:
    # WNOWAIT leaves the zombie in place, so its pid (= our process group id) cannot be
    # reused by an unrelated process before we kill the group in reap.
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def reap(proc: subprocess.Popen[bytes]) -> None:
    """Kill everything left of the run, then collect the launcher."""
    if not _has_exited(proc.pid):
        # Cut short (wall clock, output cap): the launcher's whole tree first, detached
        # processes included, which the process group below no longer holds. A launcher
        # that ended by itself has ended its tree (sandbox_launcher.end_children).
        end_descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - only with a stuck kernel
        proc.kill()
        proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def kill_uid(uid: int) -> None:
    """Kill every process running under ``uid`` (a fresh uid only this run used)."""
    for _ in range(20):
        found = False
        for pid, status in proc_files("status"):
            match = re.search(r"^Uid:\s+(\d+)", status, re.M)
            zombie = re.search(r"^State:\s+Z", status, re.M) is not None  # dead, awaiting reaping
            if match and int(match.group(1)) == uid and not zombie:
                found = True
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        if not found:
            return
        time.sleep(0.01)
