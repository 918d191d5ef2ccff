"""Run untrusted Python (model-written code) in a throw-away, resource-limited process.

The code we run comes from a policy being trained with RL, so it is treated as hostile:
a model can stumble on (or be rewarded into) infinite loops, fork bombs, memory bombs,
floods of output, stray file writes and network calls. Containment is layered, and every
layer that could be switched on is reported in ``SandboxResult.isolation``:

* ``session``   - the child leads its own process group; on timeout the whole group dies.
* ``rlimits``   - CPU seconds, address space, file size, open files, processes, no cores.
* ``netns``     - (root) an empty network namespace: not even loopback is up, so no
  connection can leave the child whatever Python trickery it uses.
* ``mountns``   - (root) a private mount namespace: fresh size-capped tmpfs over /tmp,
  /var/tmp, /dev/shm and /run/lock, and the home and project directories hidden, so the
  child can neither leave files behind nor read ``conf/local/credentials.yml``. Only the
  interpreter's own directories (and, with site-packages, its virtual environment) are
  re-exposed inside, read-only, even where they lie under /tmp (a CI clean clone).
* ``pidns``     - (root) a PID namespace; when its init exits or is killed, the kernel kills
  every process left in it, so nothing the child forked can outlive the run.
* ``uid``       - (root) the child runs under a fresh, unused uid. Linux does not enforce
  RLIMIT_NPROC for uid 0, so dropping root is what actually caps a fork bomb; a per-run uid
  (instead of the shared ``nobody``) keeps concurrent runs from eating each other's process
  quota or signalling each other, and lets us sweep up leftovers by uid.
* ``preamble``  - Python-level guard run before the candidate: internet sockets, and by
  default process creation, raise ``PermissionError``. It is a second layer only (ctypes
  or ``_socket`` get round it), useful where the kernel layers are unavailable.
* ``cleanenv``  - the environment is built from scratch, so secrets in ``os.environ`` (API
  keys) never reach the child.

Without root (a developer laptop, an unprivileged CI runner) only session, rlimits,
preamble and cleanenv are available; RLIMIT_NPROC is then set relative to the user's
current process count.

Privileged set-up happens in a small launcher process (this file run as a script), not in
``preexec_fn``: ``preexec_fn`` is unsafe when the parent has threads (the verifiers run in
thread pools and under asyncio), while the launcher is a fresh single-threaded process.

Interpreter flags for the candidate: ``-s -S -B``. ``-S`` (no ``site``) keeps third-party
packages and their ``.pth`` start-up hooks out of the child and saves start-up time;
HumanEval and LiveCodeBench need only the standard library. BigCodeBench needs numpy and
friends, hence ``site_packages=True`` (its loader asks for it per task); every other layer
applies unchanged. We do not use ``-I``/``-E``: they would make the
child ignore ``PYTHONHASHSEED``, which we set so that set/dict-order-dependent output is
reproducible; since the environment is built from scratch, ``-E`` would protect nothing.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "TestReport",
    "compare_stdout",
    "parse_call_arguments",
    "run_call_tests",
    "run_function_tests",
    "run_python",
    "run_stdio_tests",
]

# Workdir inside the private mount namespace; a fixed path keeps tracebacks reproducible.
_NS_WORKDIR = "/tmp/sandbox"
_SOLUTION_FILE = "solution.py"
_TEST_FILE = "tests.py"
_RUNNER_FILE = "_sandbox_runner.py"
_ARGS_FILE = "call_args.json"
# Fresh uids are drawn from here: far above any real account, well inside a full uid map.
_UID_BASE = 1_000_000
_UID_SPAN = 1_000_000_000
# World-writable places where a child could leave files behind; each gets a private tmpfs.
_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
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


@dataclass(frozen=True)
class TestReport:
    """Outcome of running a candidate against a test suite."""

    __test__ = False  # not a pytest test class, despite the name

    passed: int
    total: int
    first_failure: str | None
    runs: tuple[SandboxResult, ...] = field(default=(), repr=False)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    @property
    def sandbox_error(self) -> bool:
        return any(r.sandbox_error for r in self.runs)


# --------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------


def run_python(
    code: str,
    *,
    stdin: str = "",
    wall_timeout_s: float = 10,
    cpu_time_s: int = 10,
    memory_mb: int = 512,
    max_output_bytes: int = 65536,
    max_processes: int = 64,
    disk_mb: int = 64,
    allow_subprocesses: bool = False,
    site_packages: bool = False,
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in the sandbox, feeding it ``stdin``."""
    limits = SandboxLimits(
        wall_timeout_s=wall_timeout_s,
        cpu_time_s=cpu_time_s,
        memory_mb=memory_mb,
        max_output_bytes=max_output_bytes,
        max_processes=max_processes,
        disk_mb=disk_mb,
        allow_subprocesses=allow_subprocesses,
        site_packages=site_packages,
    )
    result, _ = _execute({_SOLUTION_FILE: code}, ["script"], stdin, limits, want_report=False)
    return result


def run_function_tests(
    code: str,
    test: str,
    entry_point: str | None = None,
    *,
    limits: SandboxLimits | None = None,
) -> TestReport:
    """Run a HumanEval/BigCodeBench-style test program against candidate ``code``.

    The candidate and then ``test`` are executed in one namespace. If ``test`` defines
    ``check`` and ``entry_point`` is given, ``check(entry_point)`` is the single test
    (HumanEval); otherwise every ``unittest.TestCase`` defined by ``test`` is run and the
    pass fraction counts individual test methods (BigCodeBench).

    The harness reports through a private pipe, after the tests have run, so a candidate
    that calls ``sys.exit(0)`` or ``os._exit(0)`` early does not pass. (It is not proof
    against a candidate written to attack this harness from inside the same process.)
    """
    limits = limits or SandboxLimits()
    args = ["tests", entry_point or ""]
    result, report = _execute(
        {_SOLUTION_FILE: code, _TEST_FILE: test}, args, "", limits, want_report=True
    )
    if report is None:
        total = 1
        failure = (
            result.reason
            if not result.ok
            else "the test harness did not finish (did the code exit early?)"
        )
        return TestReport(passed=0, total=total, first_failure=failure, runs=(result,))
    passed, total = int(report.get("passed", 0)), int(report.get("total", 0))
    failure = report.get("failure")
    if not result.ok and passed == total:
        # The tests passed but the process then failed (e.g. timed out while exiting).
        passed, failure = 0, result.reason
    if total == 0:
        failure = failure or "no tests were found"
    return TestReport(passed=passed, total=total, first_failure=failure, runs=(result,))


def run_stdio_tests(
    code: str,
    cases: Sequence[Mapping[str, str]],
    *,
    limits: SandboxLimits | None = None,
    stop_on_first_failure: bool = False,
) -> TestReport:
    """Run a LiveCodeBench-style program once per ``{"input", "output"}`` case.

    Outputs are compared line by line after stripping and collapsing whitespace.
    """
    limits = limits or SandboxLimits()
    passed = 0
    first_failure: str | None = None
    runs: list[SandboxResult] = []
    for i, case in enumerate(cases):
        result, _ = _execute(
            {_SOLUTION_FILE: code},
            ["script"],
            str(case.get("input", "")),
            limits,
            want_report=False,
        )
        runs.append(result)
        if result.ok and compare_stdout(result.stdout, str(case.get("output", ""))):
            passed += 1
            continue
        if first_failure is None:
            if not result.ok:
                first_failure = f"case {i}: {result.reason}"
            else:
                first_failure = f"case {i}: wrong output: expected {_preview(case.get('output', ''))}, got {_preview(result.stdout)}"
        if stop_on_first_failure:
            break
    if not cases:
        first_failure = "no test cases"
    return TestReport(
        passed=passed, total=len(cases), first_failure=first_failure, runs=tuple(runs)
    )


def parse_call_arguments(raw: str) -> list[Any]:
    """The arguments of one LeetCode-style call: one JSON value per non-blank line.

    Raises ``ValueError`` when a line is not JSON (a problem with the test data, not with
    the candidate).
    """
    args = []
    for number, line in enumerate(str(raw).split("\n"), start=1):
        if line.strip():
            try:
                args.append(json.loads(line))
            except ValueError as exc:
                raise ValueError(f"argument line {number} is not JSON: {_preview(line)}") from exc
    return args


def run_call_tests(
    code: str,
    cases: Sequence[Mapping[str, str]],
    func_name: str,
    *,
    limits: SandboxLimits | None = None,
    stop_on_first_failure: bool = False,
) -> TestReport:
    """Run a LiveCodeBench "functional" (LeetCode-style) problem once per case.

    Each case's ``input`` holds the call's arguments, one JSON value per line, and its
    ``output`` the expected return value as JSON. The candidate's ``Solution().<func_name>``
    is called (a plain function ``func_name`` when it defines no ``Solution`` class), with
    the usual LeetCode names (``List``, ``Optional``, ``collections``, ...) predefined.
    Every case runs in its own sandboxed process, as with ``run_stdio_tests``.

    The child only sees the inputs: it reports the return value as JSON (a tuple counts as
    a list, as LiveCodeBench does) and the comparison with the expected value happens here,
    so neither a peek at the expected outputs nor an object that claims to equal anything
    can pass a case.
    """
    limits = limits or SandboxLimits()
    if not cases or not func_name:
        why = "no test cases" if not cases else "the problem names no function to call (func_name)"
        return TestReport(passed=0, total=len(cases), first_failure=why)
    passed = 0
    first_failure: str | None = None
    runs: list[SandboxResult] = []
    for i, case in enumerate(cases):
        failure: str | None = None
        try:
            args = parse_call_arguments(str(case.get("input", "")))
            expected = json.loads(str(case.get("output", "")))
        except ValueError as exc:
            # Unusable test data: not the candidate's fault, but it cannot pass either.
            failure = f"case {i}: bad test data: {exc}"
        else:
            result, report = _execute(
                {_SOLUTION_FILE: code, _ARGS_FILE: json.dumps(args)},
                ["call", func_name],
                "",
                limits,
                want_report=True,
            )
            runs.append(result)
            if report is None:
                why = result.reason if not result.ok else "the harness did not report a value"
                failure = f"case {i}: {why}"
            elif "error" in report:
                failure = f"case {i}: {report['error']}"
            elif not result.ok:
                failure = f"case {i}: {result.reason}"
            elif report.get("value") != expected:
                failure = (
                    f"case {i}: wrong answer: expected {_preview(json.dumps(expected))}, "
                    f"got {_preview(json.dumps(report.get('value')))}"
                )
        if failure is None:
            passed += 1
            continue
        first_failure = first_failure or failure
        if stop_on_first_failure:
            break
    return TestReport(
        passed=passed, total=len(cases), first_failure=first_failure, runs=tuple(runs)
    )


def compare_stdout(actual: str, expected: str) -> bool:
    """Whether two program outputs agree, ignoring blank edges and runs of whitespace."""
    return _normalise_output(actual) == _normalise_output(expected)


def _normalise_output(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.strip().splitlines()]


def _preview(text: str, limit: int = 80) -> str:
    text = str(text).strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")


# --------------------------------------------------------------------------------------
# Parent side: start the launcher, watch it, collect output
# --------------------------------------------------------------------------------------


def _execute(
    files: dict[str, str],
    runner_args: list[str],
    stdin: str,
    limits: SandboxLimits,
    *,
    want_report: bool,
) -> tuple[SandboxResult, dict[str, Any] | None]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="conductor-sandbox-") as tmp:
        workdir = os.path.join(tmp, "work")
        os.mkdir(workdir)
        for name, text in {**files, _RUNNER_FILE: _RUNNER_SOURCE}.items():
            with open(os.path.join(workdir, name), "w", encoding="utf-8") as fh:
                fh.write(text)
        # stdin comes from a file, not a pipe: a child that never reads it cannot block us.
        stdin_path = os.path.join(tmp, "stdin")
        with open(stdin_path, "w", encoding="utf-8") as fh:
            fh.write(stdin)

        status_r, status_w = os.pipe()
        report_r, report_w = os.pipe() if want_report else (-1, -1)
        config = _launch_config(
            workdir, list(files) + [_RUNNER_FILE], runner_args, limits, status_w, report_w
        )
        pass_fds = (status_w,) + ((report_w,) if want_report else ())
        try:
            with open(stdin_path, "rb") as stdin_file:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-I",
                        "-S",
                        os.path.abspath(__file__),
                        "--launch",
                        json.dumps(config),
                    ],
                    stdin=stdin_file,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=pass_fds,
                    close_fds=True,
                    start_new_session=True,
                    env=_base_env(tmp),
                )
        except BaseException:
            for fd in (status_r, status_w, report_r, report_w):
                if fd >= 0:
                    os.close(fd)
            raise
        os.close(status_w)
        if want_report:
            os.close(report_w)
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
    report = None
    if want_report and watch.report_bytes:
        try:
            report = json.loads(watch.report_bytes.decode("utf-8").strip().splitlines()[-1])
        except (ValueError, IndexError):
            report = None
    return result, report


def _launch_config(
    workdir: str,
    names: list[str],
    runner_args: list[str],
    limits: SandboxLimits,
    status_fd: int,
    report_fd: int,
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
        "argv": [python, *flags, _RUNNER_FILE, json.dumps(runner_args), str(report_fd)],
        "env": _child_env(),
        "uid": _UID_BASE + secrets.randbelow(_UID_SPAN) if _fresh_uid_allowed() else None,
        "hide": sorted(p for p in hide if _maskable(p)),
        # Only outermost keeps: a nested one is re-exposed along with its parent.
        "keep": sorted(k for k in keep if not any(k != o and _within(k, o) for o in keep)),
        "limits": {
            "cpu": int(limits.cpu_time_s),
            "memory_mb": int(limits.memory_mb),
            "disk_mb": int(limits.disk_mb),
            "nofile": int(limits.max_open_files),
            "nproc": int(limits.max_processes),
        },
        "allow_subprocesses": bool(limits.allow_subprocesses),
        "status_fd": status_fd,
        "report_fd": report_fd,
        "parent_pid": os.getpid(),
    }


def _project_root() -> str | None:
    # src/conductor_pipeline/tasks/code_sandbox.py -> the checkout (holds conf/local secrets)
    root = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )
    return root if os.path.exists(os.path.join(root, "pyproject.toml")) else None


def _maskable(path: str) -> bool:
    # Masking a system directory (or an ancestor of one) would break the interpreter.
    if any(path == s or s.startswith(path.rstrip("/") + "/") for s in _SYSTEM_DIRS):
        return False
    return not any(path == w or path.startswith(w + "/") for w in _WRITABLE_DIRS)


def _fresh_uid_allowed() -> bool:
    if os.geteuid() != 0:
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
    """Kill everything left in the launcher's process group, then collect the launcher."""
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


# --------------------------------------------------------------------------------------
# Candidate side: the runner script executed inside the sandbox
# --------------------------------------------------------------------------------------

# Runs inside the child. argv: [runner, json mode args, report fd]. The guard functions
# delete themselves from the namespace the candidate sees; the candidate gets a fresh
# ``__main__`` module (or, for tests, a module called ``solution`` so that ``if __name__ ==
# "__main__"`` demos in completions do not run).
_RUNNER_SOURCE = r"""
import os, sys

def _guard(allow_subprocesses):
    import socket

    def _denied(*args, **kwargs):
        raise PermissionError("network access is disabled in the sandbox")

    class _LocalOnlySocket(socket.socket):
        # AF_UNIX stays: asyncio and socketpair() need it and it cannot leave the machine.
        def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
            fam = socket.AF_INET if family == -1 else family
            if fileno is None and fam != getattr(socket, "AF_UNIX", None):
                raise PermissionError("network access is disabled in the sandbox")
            super().__init__(family, type, proto, fileno)

    socket.socket = socket.SocketType = _LocalOnlySocket
    socket.create_connection = socket.create_server = _denied
    if allow_subprocesses:
        return

    import posix

    def _no_process(*args, **kwargs):
        raise PermissionError("creating processes is disabled in the sandbox")

    for name in ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp", "execv", "execve",
                 "execl", "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnl", "spawnle",
                 "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "popen"):
        for module in (os, posix):  # os re-exports posix; patch both spellings
            if hasattr(module, name):
                setattr(module, name, _no_process)
    try:
        import _posixsubprocess
        _posixsubprocess.fork_exec = _no_process
    except ImportError:
        pass


def _compile(path):
    with open(path, encoding="utf-8") as fh:
        return compile(fh.read(), path, "exec")


def _module(name):
    import types
    module = types.ModuleType(name)
    module.__file__ = os.path.abspath("solution.py")
    module.__builtins__ = __builtins__
    return module


def _run_script():
    module, code = _module("__main__"), _compile("solution.py")
    sys.modules["__main__"] = module
    sys.argv = ["solution.py"]
    try:
        exec(code, module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        import traceback
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        traceback.print_exception(type(exc), exc, tb)
        sys.exit(1)


def _describe(exc):
    import traceback
    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f.line for f in reversed(frames) if f.line), "")
    text = f"{type(exc).__name__}: {exc}".rstrip(": ")
    return f"{text} (at: {where})" if where else text


def _run_tests(entry_point, report_fd):
    import json
    outcome = {"passed": 0, "total": 1, "failure": None}
    try:
        module = _module("solution")
        sys.modules["solution"] = module
        exec(_compile("solution.py"), module.__dict__)
        exec(_compile("tests.py"), module.__dict__)
        check = module.__dict__.get("check")
        if entry_point and callable(check):
            if entry_point not in module.__dict__:
                raise NameError(f"the code does not define {entry_point!r}")
            check(module.__dict__[entry_point])
            outcome = {"passed": 1, "total": 1, "failure": None}
        else:
            import io, unittest
            cases = [v for v in module.__dict__.values()
                     if isinstance(v, type) and issubclass(v, unittest.TestCase) and v.__module__ == "solution"]
            suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(c) for c in cases)
            result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
            bad = list(result.failures) + list(result.errors) + [(t, "unexpected success") for t in result.unexpectedSuccesses]
            failure = None
            if bad:
                lines = [l for l in str(bad[0][1]).strip().splitlines() if l.strip()]
                failure = f"{bad[0][0].id().split('.')[-1]}: {lines[-1].strip() if lines else 'failed'}"
            outcome = {"passed": result.testsRun - len(bad), "total": result.testsRun, "failure": failure}
    except BaseException as exc:  # SystemExit too: exiting early is not passing
        outcome = {"passed": 0, "total": 1, "failure": _describe(exc)}
    os.write(report_fd, (json.dumps(outcome) + "\n").encode())


_CALL_PRELUDE = (
    "from typing import *\n"
    "import bisect, collections, functools, heapq, itertools, math, operator, re, string\n"
    "from bisect import *\nfrom collections import *\nfrom functools import *\n"
    "from heapq import *\nfrom itertools import *\nfrom math import *\n"
)


def _run_call(func_name, report_fd):
    # LeetCode starter code uses List, Optional, deque... without importing them: the
    # judge predefines them, so we do too (in the namespace, not the source, so that
    # tracebacks keep the candidate's line numbers).
    import json
    try:
        with open("call_args.json", encoding="utf-8") as fh:
            args = json.load(fh)
        module = _module("solution")
        sys.modules["solution"] = module
        exec(compile(_CALL_PRELUDE, "<prelude>", "exec"), module.__dict__)
        sys.setrecursionlimit(20000)  # recursive DFS is idiomatic on LeetCode
        exec(_compile("solution.py"), module.__dict__)
        owner = module.__dict__.get("Solution")
        if isinstance(owner, type):
            target = getattr(owner(), func_name, None)
        else:
            target = module.__dict__.get(func_name)
        if not callable(target):
            raise NameError(f"the code defines no Solution.{func_name} (nor a function {func_name})")
        value = target(*args)
        if isinstance(value, tuple):
            value = list(value)
        try:
            line = json.dumps({"value": value}, allow_nan=True)
        except (TypeError, ValueError):
            line = json.dumps({"error": f"returned {type(value).__name__}, which is not a JSON value"})
    except BaseException as exc:  # SystemExit too: exiting is not answering
        line = json.dumps({"error": _describe(exc)})
    os.write(report_fd, (line + "\n").encode())


def _restore_exit():
    # exit()/quit() come from the site module, which -S skips; competitive-programming
    # solutions call them, so provide the same behaviour.
    import builtins
    if not hasattr(builtins, "exit"):
        def exit(code=None):
            raise SystemExit(code)
        builtins.exit = builtins.quit = exit


def _main():
    import json
    _restore_exit()
    mode = json.loads(sys.argv[1])
    report_fd = int(sys.argv[2])
    _guard(os.environ.get("SANDBOX_ALLOW_SUBPROCESSES") == "1")
    os.environ.pop("SANDBOX_ALLOW_SUBPROCESSES", None)
    if mode[0] == "tests":
        _run_tests(mode[1], report_fd)
    elif mode[0] == "call":
        _run_call(mode[1], report_fd)
    else:
        _run_script()


_main()
"""


# --------------------------------------------------------------------------------------
# Launcher side: privileged set-up in a fresh process (this file run as a script)
# --------------------------------------------------------------------------------------

_CLONE_NEWNS = 0x00020000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2
_PR_SET_PDEATHSIG = 1


class _Libc:
    """The few libc calls Python 3.11's os module lacks (unshare arrived in 3.12)."""

    def __init__(self) -> None:
        import ctypes

        self._ctypes = ctypes
        self._lib = ctypes.CDLL(None, use_errno=True)
        self._lib.mount.argtypes = [
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_ulong,
            ctypes.c_char_p,
        ]
        self._lib.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self._lib.unshare.argtypes = [ctypes.c_int]
        self._lib.prctl.argtypes = [
            ctypes.c_int,
            ctypes.c_ulong,
            ctypes.c_ulong,
            ctypes.c_ulong,
            ctypes.c_ulong,
        ]

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            errno = self._ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    def unshare(self, flags: int) -> bool:
        return self._lib.unshare(flags) == 0

    def mount(
        self,
        source: str | None,
        target: str,
        fstype: str | None,
        flags: int,
        data: str | None = None,
    ) -> None:
        enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
        self._check(self._lib.mount(enc[0], enc[1], enc[2], flags, enc[3]), f"mount {target}")

    def umount(self, target: str) -> None:
        self._check(self._lib.umount2(target.encode(), _MNT_DETACH), f"umount {target}")

    def die_with_parent(self) -> None:
        self._lib.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _launcher_main(config: dict[str, Any]) -> None:
    status_fd = int(config["status_fd"])
    os.set_inheritable(status_fd, False)  # the candidate must not be able to forge status

    def emit(**event: Any) -> None:
        os.write(status_fd, (json.dumps(event) + "\n").encode())

    try:
        libc = _Libc()
        libc.die_with_parent()
        if os.getppid() != config["parent_pid"]:
            os._exit(1)  # the parent died before prctl took effect
        os.umask(0o022)
        layers = ["session", "rlimits", "cleanenv"]
        layers += [] if config["allow_subprocesses"] else ["preamble"]
        root = os.geteuid() == 0
        if root:
            for flag, name in (
                (_CLONE_NEWNET, "netns"),
                (_CLONE_NEWNS, "mountns"),
                (_CLONE_NEWPID, "pidns"),
            ):
                if libc.unshare(flag):
                    layers.append(name)
        workdir = config["workdir"]
        if "mountns" in layers:
            workdir = _build_filesystem(libc, config)
        uid = config["uid"]
        if (
            uid is not None
            and "mountns" not in layers
            and not _reachable_by_others(config["keep"] + [config["python"]])
        ):
            uid = None  # the interpreter sits in a private directory we cannot expose
        if uid is not None:
            if "mountns" not in layers:
                os.chmod(os.path.dirname(workdir), 0o711)  # let the uid reach its workdir
            for dirpath, _, filenames in os.walk(workdir):
                os.chown(dirpath, uid, uid)
                for name in filenames:
                    os.chown(os.path.join(dirpath, name), uid, uid)
            layers.append("uid")
        emit(event="isolation", layers=layers, uid=uid)
    except BaseException as exc:
        emit(event="setup_error", message=f"{type(exc).__name__}: {exc}")
        os._exit(1)

    init = os.fork()
    if init == 0:
        _init_main(libc, config, workdir, uid, "pidns" in layers and "mountns" in layers, emit)
    _, status = os.waitpid(init, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _build_filesystem(libc: _Libc, config: dict[str, Any]) -> str:
    """Private /tmp & co, hidden home/project dirs, and a workdir on the private tmpfs."""
    sources = {}
    for name in config["files"]:
        with open(os.path.join(config["workdir"], name), encoding="utf-8") as fh:
            sources[name] = fh.read()
    # Without this, mounts below could propagate back to the host's namespace.
    libc.mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    size = f"size={int(config['limits']['disk_mb'])}m"
    _private_tmpfs(libc, "/tmp", size, config["keep"])
    _mask_directories(libc, config["hide"], config["keep"])
    for path in _WRITABLE_DIRS[1:]:
        if os.path.isdir(path) and not os.path.islink(path):
            _private_tmpfs(libc, path, size, config["keep"])
    os.makedirs(_NS_WORKDIR, mode=0o755)
    for name, text in sources.items():
        with open(os.path.join(_NS_WORKDIR, name), "w", encoding="utf-8") as fh:
            fh.write(text)
    return _NS_WORKDIR


def _private_tmpfs(libc: _Libc, target: str, size: str, keep: list[str]) -> None:
    """Cover ``target`` with a fresh tmpfs, re-exposing (read-only) any ``keep`` dir inside it.

    A virtual environment can live under /tmp (a clean clone in CI does); covering /tmp
    without re-exposing it would hide the interpreter that site-packages runs need
    (FileNotFoundError at exec). Each such dir is opened before the tmpfs goes on and
    bind-mounted back through its /proc/self/fd link, which still names the covered dir.
    """
    inner = [k for k in keep if k != target and _within(k, target)]
    handles = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in inner]
    try:
        libc.mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, f"{size},mode=1777")
        for path, fd in handles:
            os.makedirs(path, mode=0o755, exist_ok=True)
            libc.mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
            libc.mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
    finally:
        for _, fd in handles:
            os.close(fd)


def _mask_directories(libc: _Libc, hide: list[str], keep: list[str]) -> None:
    """Cover each ``hide`` dir with an empty read-only tmpfs, re-exposing ``keep`` dirs inside."""
    stash_root = "/tmp/.sandbox-stash"
    os.mkdir(stash_root, 0o700)
    masked: list[str] = []
    for target in sorted(hide, key=len):
        if any(_within(target, m) for m in masked):
            continue  # already hidden by an enclosing mask
        if any(_within(target, k) for k in keep):
            continue  # hiding it would hide the interpreter itself
        inner = [k for k in keep if _within(k, target)]
        stashed = []
        for i, path in enumerate(inner):
            stash = os.path.join(stash_root, f"{len(masked)}-{i}")
            os.mkdir(stash)
            libc.mount(path, stash, None, _MS_BIND | _MS_REC)
            stashed.append((path, stash))
        libc.mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=755")
        for path, stash in stashed:
            os.makedirs(path, mode=0o755, exist_ok=True)
            libc.mount(stash, path, None, _MS_BIND | _MS_REC)
            libc.mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
            libc.umount(stash)
            os.rmdir(stash)
        libc.mount(
            None,
            target,
            None,
            _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV,
            "size=1m,mode=755",
        )
        masked.append(target)
    os.rmdir(stash_root)


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _reachable_by_others(paths: list[str]) -> bool:
    """Whether an unrelated uid could traverse to every path (e.g. not under a 0700 /root)."""
    for path in paths:
        current = os.path.realpath(path)
        while True:
            try:
                mode = os.stat(current).st_mode
            except OSError:
                return False
            if os.path.isdir(current) and not mode & 0o001:
                return False
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent
    return True


def _init_main(
    libc: _Libc, config: dict[str, Any], workdir: str, uid: int | None, fresh_proc: bool, emit: Any
) -> None:
    """PID 1 of the namespace (or a plain middle process): run the candidate, report its end."""
    try:
        libc.die_with_parent()
        if fresh_proc:
            # Hide the host's process list (command lines of other processes).
            with contextlib.suppress(OSError):
                libc.mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        child = os.fork()
        if child == 0:
            _exec_candidate(config, workdir, uid, emit)
        while True:
            try:
                _, status = os.waitpid(child, 0)
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
        if os.WIFSIGNALED(status):
            emit(event="exit", signal=os.WTERMSIG(status))
        else:
            emit(event="exit", returncode=os.WEXITSTATUS(status))
    except BaseException as exc:
        emit(event="setup_error", message=f"{type(exc).__name__}: {exc}")
    os._exit(0)  # as PID 1, exiting makes the kernel kill everything the candidate left


def _exec_candidate(config: dict[str, Any], workdir: str, uid: int | None, emit: Any) -> None:
    import resource

    try:
        limits = config["limits"]
        mb = 1024 * 1024
        nproc = int(limits["nproc"])
        if uid is None and os.geteuid() != 0:
            # Without a fresh uid the limit counts every process the user already has
            # (this one included, which is already part of the budget).
            nproc += _count_processes(os.getuid()) - 1
        for res, value in (
            (resource.RLIMIT_CPU, int(limits["cpu"])),
            (resource.RLIMIT_AS, int(limits["memory_mb"]) * mb),
            (resource.RLIMIT_FSIZE, int(limits["disk_mb"]) * mb),
            (resource.RLIMIT_NOFILE, int(limits["nofile"])),
            (resource.RLIMIT_NPROC, nproc),
            (resource.RLIMIT_CORE, 0),
        ):
            soft, hard = resource.getrlimit(res)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            # CPU gets one second of grace between SIGXCPU (reportable) and SIGKILL.
            resource.setrlimit(
                res,
                (
                    value,
                    value + 1
                    if res == resource.RLIMIT_CPU and hard == resource.RLIM_INFINITY
                    else value,
                ),
            )
        os.chdir(workdir)
        env = dict(config["env"], HOME=workdir, TMPDIR=workdir)
        if config["allow_subprocesses"]:
            env["SANDBOX_ALLOW_SUBPROCESSES"] = "1"
        if config["report_fd"] >= 0:
            os.set_inheritable(int(config["report_fd"]), True)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.execve(config["python"], config["argv"], env)
    except BaseException as exc:
        emit(
            event="setup_error",
            message=f"starting the interpreter failed: {type(exc).__name__}: {exc}",
        )
    os._exit(127)


def _count_processes(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += 1
            except OSError:
                pass
    return count


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--launch":
    _launcher_main(json.loads(sys.argv[2]))
