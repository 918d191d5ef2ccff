"""Parent side of a sandboxed run: start the launcher, watch it, judge what happened.

``execute`` writes the files into a throw-away directory, starts ``sandbox_launcher`` (which
sets up the isolation and runs ``sandbox_harness`` as the candidate's interpreter), reads the
output incrementally under the output cap and the wall clock, kills whatever is left, and
turns the launcher's status events into a ``SandboxResult``. Test verdicts come back on a
separate report pipe and count only when authenticated with the run's key (see
``sandbox_harness`` for what that does and does not defend).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import json
import os
import re
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor_pipeline.tasks.sandbox_launcher import WRITABLE_DIRS, end_descendants, within

__all__ = [
    "ARGS_FILE",
    "CONTEXT_FILE",
    "SOLUTION_FILE",
    "TEST_FILE",
    "SandboxLimits",
    "SandboxResult",
    "execute",
    "read_report",
]

SOLUTION_FILE = "solution.py"
TEST_FILE = "tests.py"
CONTEXT_FILE = "context.py"  # trusted source the check driver runs before the tests
_RUNNER_FILE = "_sandbox_runner.py"
# The modules the harness imports from its own directory (its shared parts, check mode and
# the plain-data codec), copied under their own names.
_HARNESS_MODULES = ("sandbox_child.py", "sandbox_check.py", "sandbox_plain.py")
ARGS_FILE = "call_args.json"
# Fresh uids are drawn from here: far above any real account, well inside a full uid map.
_UID_BASE = 1_000_000
_UID_SPAN = 1_000_000_000
# Directories never masked, even if they are the cwd or $HOME of the caller.
_SYSTEM_DIRS = (
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib64",
    "/opt",
    "/proc",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/usr",
    "/var",
)


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run (defaults suit a HumanEval-sized program)."""

    wall_timeout_s: float = 10.0
    cpu_time_s: int = 10
    memory_mb: int = 512
    max_output_bytes: int = 65536
    max_processes: int = 64  # counts threads too (RLIMIT_NPROC counts tasks)
    disk_mb: int = 64  # largest file (RLIMIT_FSIZE) and size of each private tmpfs
    max_open_files: int = 256
    allow_subprocesses: bool = False  # preamble layer; the kernel layers apply regardless
    site_packages: bool = False  # True for code that imports numpy/pandas (BigCodeBench)


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
        workdir = _write_workdir(tmp, files, stdin)
        status_r, status_w = os.pipe()
        report_r, report_w = os.pipe() if want_report else (-1, -1)
        key_r, key_w = os.pipe() if want_report else (-1, -1)
        if want_report:
            os.write(key_w, key)  # 32 bytes fit in any pipe buffer: no blocking
            os.close(key_w)
        names = [*files, *_harness_files()]
        config = _launch_config(workdir, names, runner_args, limits)
        config.update(status_fd=status_w, report_fd=report_w, key_fd=key_r)
        try:
            proc = _start_launcher(tmp, config, [status_w, report_w, key_r])
        except BaseException:
            for fd in (status_r, report_r):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            for fd in (status_w, report_w, key_r):
                if fd >= 0:
                    os.close(fd)
        watch = _Watch()
        try:
            watch = _watch(proc, report_r if want_report else None, limits, started)
        finally:
            _reap(proc)
            status = _drain(status_r)
            os.close(status_r)
            if want_report:
                watch.report_bytes += _drain(report_r)
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
        _kill_uid(uid)
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


@functools.cache
def _harness_files() -> dict[str, str]:
    # The harness is a module of this package; the child gets a copy in its workdir,
    # because in a private mount namespace the project directory is hidden.
    here = Path(__file__).parent
    files = {_RUNNER_FILE: (here / "sandbox_harness.py").read_text(encoding="utf-8")}
    for name in _HARNESS_MODULES:
        files[name] = (here / name).read_text(encoding="utf-8")
    return files


def _write_workdir(tmp: str, files: dict[str, str], stdin: str) -> str:
    workdir = os.path.join(tmp, "work")
    os.mkdir(workdir)
    for name, text in {**files, **_harness_files()}.items():
        with open(os.path.join(workdir, name), "w", encoding="utf-8") as fh:
            fh.write(text)
    # stdin comes from a file, not a pipe: a child that never reads it cannot block us.
    with open(os.path.join(tmp, "stdin"), "w", encoding="utf-8") as fh:
        fh.write(stdin)
    return workdir


def _start_launcher(
    tmp: str, config: dict[str, Any], pass_fds: list[int]
) -> subprocess.Popen[bytes]:
    launcher = Path(__file__).with_name("sandbox_launcher.py")
    with open(os.path.join(tmp, "stdin"), "rb") as stdin_file:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", str(launcher), "--launch", json.dumps(config)],
            stdin=stdin_file,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=[fd for fd in pass_fds if fd >= 0],
            close_fds=True,
            start_new_session=True,
            env=_base_env(tmp),
        )


def _launch_config(
    workdir: str,
    names: list[str],
    runner_args: list[str],
    limits: SandboxLimits,
) -> dict[str, Any]:
    # With site-packages we must start through the venv entry point so that its
    # pyvenv.cfg is found; otherwise the real binary needs nothing from the venv.
    python = sys.executable if limits.site_packages else os.path.realpath(sys.executable)
    keep = {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.realpath(sys.executable))}
    if limits.site_packages:
        keep.add(os.path.realpath(sys.prefix))
    try:
        cwd: str | None = os.getcwd()
    except OSError:  # the caller's cwd was deleted
        cwd = None
    hide = set()
    for candidate in (os.path.expanduser("~"), cwd, _project_root()):
        if candidate and os.path.isdir(candidate):
            hide.add(os.path.realpath(candidate))
    flags = ["-s", "-B"] + ([] if limits.site_packages else ["-S"])
    return {
        "workdir": workdir,
        "files": names,
        "python": python,
        # The mode only: the report channel and the key are found at fixed descriptors.
        "argv": [python, *flags, _RUNNER_FILE, json.dumps(runner_args)],
        "env": _child_env(),
        "uid": _UID_BASE + secrets.randbelow(_UID_SPAN) if _fresh_uid_allowed() else None,
        "hide": sorted(p for p in hide if _maskable(p)),
        # Only outermost keeps: a nested one is re-exposed along with its parent.
        "keep": sorted(k for k in keep if not any(k != o and within(k, o) for o in keep)),
        "limits": {
            "cpu": int(limits.cpu_time_s),
            "memory_mb": int(limits.memory_mb),
            "disk_mb": int(limits.disk_mb),
            "nofile": int(limits.max_open_files),
            "nproc": int(limits.max_processes),
        },
        "allow_subprocesses": bool(limits.allow_subprocesses),
        "parent_pid": os.getpid(),
        "kernel_layers": _kernel_layers_allowed(),
    }


def _project_root() -> str | None:
    # src/conductor_pipeline/tasks/sandbox_process.py -> the checkout (holds conf/local secrets)
    root = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )
    return root if os.path.exists(os.path.join(root, "pyproject.toml")) else None


def _maskable(path: str) -> bool:
    # Masking a system directory (or an ancestor of one) would break the interpreter.
    if any(path == s or s.startswith(path.rstrip("/") + "/") for s in _SYSTEM_DIRS):
        return False
    return not any(path == w or path.startswith(w + "/") for w in WRITABLE_DIRS)


def _kernel_layers_allowed() -> bool:
    # Namespaces and a fresh uid need root; tests switch both off to run the unprivileged
    # mode on a root machine.
    return os.geteuid() == 0


def _fresh_uid_allowed() -> bool:
    if not _kernel_layers_allowed():
        return False
    try:
        with open("/proc/self/uid_map", encoding="ascii") as fh:
            for line in fh:
                inside, _, count = (int(x) for x in line.split())
                if inside <= _UID_BASE and inside + count >= _UID_BASE + _UID_SPAN:
                    return True
    except (OSError, ValueError):
        pass
    return False


def _base_env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home}


def _child_env() -> dict[str, str]:
    # Built from nothing on purpose: the caller's environment holds API keys.
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        # One thread per numeric library: threads count against RLIMIT_NPROC.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }


@dataclass
class _Watch:
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    report_bytes: bytes = b""
    timed_out: bool = False
    overflow: bool = False


def _watch(
    proc: subprocess.Popen[bytes], report_fd: int | None, limits: SandboxLimits, started: float
) -> _Watch:
    """Read the child's output incrementally until it ends, overflows or runs out of time."""
    watch = _Watch()
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
    # reused by an unrelated process before we kill the group in _reap.
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _reap(proc: subprocess.Popen[bytes]) -> None:
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


def _drain(fd: int) -> bytes:
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


def _kill_uid(uid: int) -> None:
    """Kill every process running under ``uid`` (a fresh uid only this run used)."""
    for _ in range(20):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as fh:
                    status = fh.read()
            except OSError:
                continue
            match = re.search(r"^Uid:\s+(\d+)", status, re.M)
            zombie = re.search(r"^State:\s+Z", status, re.M) is not None  # dead, awaiting reaping
            if match and int(match.group(1)) == uid and not zombie:
                found = True
                with contextlib.suppress(OSError):
                    os.kill(int(entry), signal.SIGKILL)
        if not found:
            return
        time.sleep(0.01)


def _interpret(
    launcher_rc: int | None,
    events: list[dict[str, Any]],
    watch: _Watch,
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
