"""What every mode of the sandbox harness shares inside the sandboxed interpreter: loading
the candidate (the preamble guard, a fresh module, its compiled source, exceptions described
in words) and the verdict channel (the run's key, the signed report).

Copied next to ``sandbox_harness`` into the run's working directory, like it; standard
library only and importable without side effects. Why the report is signed, and what that
does and does not defend, is explained in ``sandbox_harness``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

# Must equal sandbox_launcher.REPORT_FD / KEY_FD (a test checks it).
REPORT_FD = 3
KEY_FD = 4
_KEY_BYTES = 32


# --------------------------------------------------------------------------------------
# Candidate loading (shared by every mode)
# --------------------------------------------------------------------------------------


def guard(allow_subprocesses: bool) -> None:
    """Python-level second layer: internet sockets and process creation raise."""
    import socket

    def _denied(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError("network access is disabled in the sandbox")

    class _LocalOnlySocket(socket.socket):
        # AF_UNIX stays: asyncio and socketpair() need it and it cannot leave the machine.
        def __init__(self, family: Any = -1, type: Any = -1, proto: int = -1, fileno: Any = None):
            fam = socket.AF_INET if family == -1 else family
            if fileno is None and fam != getattr(socket, "AF_UNIX", None):
                raise PermissionError("network access is disabled in the sandbox")
            super().__init__(family, type, proto, fileno)

    socket.socket = socket.SocketType = _LocalOnlySocket  # type: ignore[misc]
    socket.create_connection = socket.create_server = _denied  # type: ignore[assignment]
    if allow_subprocesses:
        return

    import posix

    def _no_process(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError("creating processes is disabled in the sandbox")

    names = (
        "fork", "forkpty", "system", "posix_spawn", "posix_spawnp", "execv", "execve",
        "execl", "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnl", "spawnle",
        "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "popen",
    )  # fmt: skip
    for name in names:
        for module in (os, posix):  # os re-exports posix; patch both spellings
            if hasattr(module, name):
                setattr(module, name, _no_process)
    try:
        import _posixsubprocess

        _posixsubprocess.fork_exec = _no_process
    except ImportError:
        pass


def compile_file(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return compile(fh.read(), path, "exec")


def candidate_module(name: str) -> Any:
    # A fresh module for the candidate (``solution`` for tests, so that ``if __name__ ==
    # "__main__"`` demos in completions do not run), never the harness's own namespace.
    import builtins
    import types

    module = types.ModuleType(name)
    module.__file__ = os.path.abspath("solution.py")
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    return module


def describe(exc: BaseException) -> str:
    given = getattr(exc, "sandbox_description", None)
    if isinstance(given, str):  # raised by the candidate, described in its process
        return given
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f.line for f in reversed(frames) if f.line), "")
    text = f"{type(exc).__name__}: {exc}".rstrip(": ")
    return f"{text} (at: {where})" if where else text


def restore_exit() -> None:
    # exit()/quit() come from the site module, which -S skips; competitive-programming
    # solutions call them, so provide the same behaviour.
    import builtins

    if not hasattr(builtins, "exit"):

        def exit(code: Any = None) -> None:
            raise SystemExit(code)

        builtins.exit = builtins.quit = exit  # type: ignore[attr-defined]


def flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


# --------------------------------------------------------------------------------------
# The verdict channel
# --------------------------------------------------------------------------------------


def read_key() -> bytes:
    """The run's key from KEY_FD, which is then closed (empty when there is none)."""
    chunks = b""
    try:
        while len(chunks) < _KEY_BYTES:
            chunk = os.read(KEY_FD, _KEY_BYTES - len(chunks))
            if not chunk:
                break
            chunks += chunk
        os.close(KEY_FD)
    except OSError:
        return b""
    return chunks


def send_report(key: bytes, report: dict[str, Any]) -> None:
    import hashlib
    import hmac
    import json

    body = json.dumps(report, allow_nan=True)
    mac = hmac.new(key, body.encode("utf-8"), hashlib.sha256).hexdigest()
    os.write(REPORT_FD, (json.dumps({"report": body, "mac": mac}) + "\n").encode())
