"""What the parent sets up before a sandboxed run: the resource limits, the working
directory (the candidate's files next to a copy of the harness) and the configuration the
launcher applies (interpreter and flags, an environment built from nothing, a fresh uid,
the directories to hide and to keep, the rlimits), then the launcher process itself.

The file names are the harness's: ``sandbox_harness`` reads the candidate from
``SOLUTION_FILE``, the tests from ``TEST_FILE``, the task's trusted prompt from
``CONTEXT_FILE`` and a call's arguments from ``ARGS_FILE``.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conductor_pipeline.tasks.sandbox_launcher import WRITABLE_DIRS, within

__all__ = [
    "ARGS_FILE",
    "CONTEXT_FILE",
    "SOLUTION_FILE",
    "TEST_FILE",
    "SandboxLimits",
    "harness_files",
    "launch_config",
    "start_launcher",
    "write_workdir",
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


@functools.cache
def harness_files() -> dict[str, str]:
    # The harness is a module of this package; the child gets a copy in its workdir,
    # because in a private mount namespace the project directory is hidden.
    here = Path(__file__).parent
    files = {_RUNNER_FILE: (here / "sandbox_harness.py").read_text(encoding="utf-8")}
    for name in _HARNESS_MODULES:
        files[name] = (here / name).read_text(encoding="utf-8")
    return files


def write_workdir(tmp: str, files: dict[str, str], stdin: str) -> str:
    workdir = os.path.join(tmp, "work")
    os.mkdir(workdir)
    for name, text in {**files, **harness_files()}.items():
        with open(os.path.join(workdir, name), "w", encoding="utf-8") as fh:
            fh.write(text)
    # stdin comes from a file, not a pipe: a child that never reads it cannot block us.
    with open(os.path.join(tmp, "stdin"), "w", encoding="utf-8") as fh:
        fh.write(stdin)
    return workdir


def start_launcher(
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


def launch_config(
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
    # src/conductor_pipeline/tasks/sandbox_setup.py -> the checkout (holds conf/local secrets)
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
