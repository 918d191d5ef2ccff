"""The program the sandboxed interpreter runs: load the candidate, run it, report a verdict.

``sandbox_process`` copies this file into the run's working directory and the launcher
starts it as ``python -s -B [-S] _sandbox_runner.py MODE``. It uses the standard library
only (``-S`` leaves site-packages out) and must stay importable without side effects, so
that its plain-data codec can be unit-tested. Modes:

* ``["script"]``           - run ``solution.py`` as ``__main__`` (stdio programs, run_python).
* ``["check", entry]``     - HumanEval: ``check(entry)`` from ``tests.py``, split over two
  processes (below).
* ``["tests", entry]``     - BigCodeBench: the ``unittest`` cases of ``tests.py``, run in the
  candidate's own process.
* ``["call", func_name]``  - LiveCodeBench functional: call the function with the JSON
  arguments in ``call_args.json``; the parent compares the returned value.

How a verdict reaches the parent, and why the code under test cannot forge it
------------------------------------------------------------------------------
The launcher hands the interpreter two descriptors at fixed numbers, never named in argv:
``REPORT_FD`` (a pipe to the parent) and ``KEY_FD`` (a pipe holding 32 random bytes the
parent made for this run). The harness writes one line, ``{"report": ..., "mac": ...}``,
where ``mac`` is HMAC-SHA256 of the report under that key; the parent ignores anything
else, and more than one line voids the report. The launcher and the namespace's init close
their copies of both pipes before the candidate exists and are non-dumpable, so the only
holder is this process.

*check mode (HumanEval; with the script and call modes below, every code test a training
reward uses).* The harness forks before any candidate code runs. The child (the *worker*)
closes both descriptors first thing, installs the preamble guard, loads ``solution.py`` and
then only answers calls: "call function NAME with these arguments" -> the return value. The
parent (the *driver*) makes itself non-dumpable, reads the key, reads and deletes
``tests.py`` (and ``context.py``, the task's prompt), lets the worker start, and runs
``check`` against proxies that forward each call to the worker. The tests' namespace is the
prompt's (trusted helpers and imports) plus, from the candidate, only the entry point and
names that neither the prompt nor the built-ins define: redefining ``poly`` or ``abs``
changes nothing. Arguments and results cross as plain data only (``encode``/``decode``:
None, bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset; subclasses
are reduced to their base type), so every comparison in ``check`` is between objects the
driver built: an object whose ``__eq__`` always answers True is refused at ``encode`` (it is
no plain data), and an ``int`` subclass with such an ``__eq__`` arrives as a plain ``int``.
What the candidate can reach from its process: its own memory (no key: it was read after the
fork; no tests: they were deleted before it ran), the reply pipe (writing to it is the same
as returning a value), and signals to the driver (which only make the run fail). It cannot
open the driver's descriptors or memory through ``/proc`` or ptrace (non-dumpable). Forging
a report needs the key, which exists only in the parent, the driver and the key pipe, none
of which the candidate can read. That is enough because the verdict is decided and written
entirely in the driver, after ``check`` returned, from values it decoded itself: the
candidate can influence it only through the values it returns.

*tests and call modes.* The candidate runs in the harness's own process, so it can read
anything the harness holds (the key included, e.g. through ``gc``) and can even change how
the tests run (frames, tracing, ``ctypes``). The key is read and its descriptor closed before
the candidate is loaded, which stops a candidate that merely writes to a descriptor, but it
is not a boundary. This is acceptable where it is used: ``call`` reports a value that the
parent compares (forging a report equals returning a value, and the expected values never
enter the sandbox), and ``tests`` serves BigCodeBench, an evaluation benchmark whose tests
must share the candidate's process (they patch its modules and inspect DataFrames).

Not defended here: a candidate running as root (no fresh uid available) or a kernel that lets
a same-uid process attach to the *parent* (no Yama ``ptrace_scope`` >= 1, and no fresh uid):
such a candidate can reach the parent's memory, where the key and the tests live.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

try:  # in the sandbox: the copy next to this file (the package is not importable there)
    from sandbox_plain import decode, encode
except ImportError:  # imported as part of the package (tests)
    from conductor_pipeline.tasks.sandbox_plain import decode, encode

# Must equal sandbox_launcher.REPORT_FD / KEY_FD (a test checks it).
REPORT_FD = 3
KEY_FD = 4
_KEY_BYTES = 32
# Largest message between driver and worker; a bigger one is refused, not buffered.
_MAX_MESSAGE = 32 * 1024 * 1024


# --------------------------------------------------------------------------------------
# Candidate loading (shared by every mode)
# --------------------------------------------------------------------------------------


def _guard(allow_subprocesses: bool) -> None:
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


def _compile(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return compile(fh.read(), path, "exec")


def _module(name: str) -> Any:
    # A fresh module for the candidate (``solution`` for tests, so that ``if __name__ ==
    # "__main__"`` demos in completions do not run), never the harness's own namespace.
    import types

    module = types.ModuleType(name)
    module.__file__ = os.path.abspath("solution.py")
    module.__builtins__ = __builtins__  # type: ignore[attr-defined]
    return module


def _describe(exc: BaseException) -> str:
    given = getattr(exc, "sandbox_description", None)
    if isinstance(given, str):  # raised by the candidate, described in its process
        return given
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = next((f.line for f in reversed(frames) if f.line), "")
    text = f"{type(exc).__name__}: {exc}".rstrip(": ")
    return f"{text} (at: {where})" if where else text


def _restore_exit() -> None:
    # exit()/quit() come from the site module, which -S skips; competitive-programming
    # solutions call them, so provide the same behaviour.
    import builtins

    if not hasattr(builtins, "exit"):

        def exit(code: Any = None) -> None:
            raise SystemExit(code)

        builtins.exit = builtins.quit = exit  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------
# The verdict channel
# --------------------------------------------------------------------------------------


def _read_key() -> bytes:
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


def _send_report(key: bytes, report: dict[str, Any]) -> None:
    import hashlib
    import hmac
    import json

    body = json.dumps(report, allow_nan=True)
    mac = hmac.new(key, body.encode("utf-8"), hashlib.sha256).hexdigest()
    os.write(REPORT_FD, (json.dumps({"report": body, "mac": mac}) + "\n").encode())


# --------------------------------------------------------------------------------------
# Modes that run the candidate in this process
# --------------------------------------------------------------------------------------


def _run_script() -> None:
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


def _run_unittests(key: bytes) -> None:
    import io
    import unittest

    try:
        module = _module("solution")
        sys.modules["solution"] = module
        exec(_compile("solution.py"), module.__dict__)
        exec(_compile("tests.py"), module.__dict__)
        cases = [
            v
            for v in module.__dict__.values()
            if isinstance(v, type)
            and issubclass(v, unittest.TestCase)
            and v.__module__ == "solution"
        ]
        loader = unittest.defaultTestLoader
        suite = unittest.TestSuite(loader.loadTestsFromTestCase(c) for c in cases)
        result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
        bad = list(result.failures) + list(result.errors)
        bad += [(t, "unexpected success") for t in result.unexpectedSuccesses]
        failure = None
        if bad:
            lines = [line for line in str(bad[0][1]).strip().splitlines() if line.strip()]
            last = lines[-1].strip() if lines else "failed"
            failure = f"{bad[0][0].id().split('.')[-1]}: {last}"
        outcome = {"passed": result.testsRun - len(bad), "total": result.testsRun}
        outcome["failure"] = failure
    except BaseException as exc:  # SystemExit too: exiting early is not passing
        outcome = {"passed": 0, "total": 1, "failure": _describe(exc)}
    _send_report(key, outcome)


_CALL_PRELUDE = (
    "from typing import *\n"
    "import bisect, collections, functools, heapq, itertools, math, operator, re, string\n"
    "from bisect import *\nfrom collections import *\nfrom functools import *\n"
    "from heapq import *\nfrom itertools import *\nfrom math import *\n"
)


def _run_call(func_name: str, key: bytes) -> None:
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
            raise NameError(
                f"the code defines no Solution.{func_name} (nor a function {func_name})"
            )
        value = target(*args)
        if isinstance(value, tuple):
            value = list(value)
        try:
            report = {"value": json.loads(json.dumps(value, allow_nan=True))}
        except (TypeError, ValueError):
            name = type(value).__name__
            report = {"error": f"returned {name}, which is not a JSON value"}
    except BaseException as exc:  # SystemExit too: exiting is not answering
        report = {"error": _describe(exc)}
    _send_report(key, report)


# --------------------------------------------------------------------------------------
# check mode: the driver runs the tests, the worker runs the candidate
# --------------------------------------------------------------------------------------


class _Link:
    """One newline-delimited JSON message at a time over a pair of pipes."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._in = os.fdopen(read_fd, "rb")
        self._out = os.fdopen(write_fd, "wb")

    def send(self, message: Any) -> None:
        import json

        self._out.write(json.dumps(message, allow_nan=True).encode() + b"\n")
        self._out.flush()

    def receive(self) -> Any:
        """The next message; None at end of stream or for anything unreadable."""
        import json

        line = self._in.readline(_MAX_MESSAGE)
        if not line.endswith(b"\n"):
            return None
        try:
            return json.loads(line)
        except (ValueError, RecursionError):
            return None

    def close(self) -> None:
        for stream in (self._out, self._in):
            with contextlib.suppress(OSError):
                stream.close()


class CandidateGone(Exception):
    """The candidate's process ended (or answered nonsense) while the tests needed it."""


def _run_check(entry_point: str, allow_subprocesses: bool) -> None:
    _not_dumpable()  # before the fork: the worker must not reach our memory or descriptors
    to_worker_r, to_worker_w = os.pipe()
    to_driver_r, to_driver_w = os.pipe()
    worker = os.fork()
    if worker == 0:
        try:
            for fd in (REPORT_FD, KEY_FD, to_worker_w, to_driver_r):
                os.close(fd)
            _serve_candidate(_Link(to_worker_r, to_driver_w), allow_subprocesses)
        finally:
            os._exit(0)
    os.close(to_worker_r)
    os.close(to_driver_w)
    key = _read_key()  # after the fork: the worker's copy of our memory has no key
    link = _Link(to_driver_r, to_worker_w)
    try:
        outcome = _drive_check(entry_point, link)
    except BaseException as exc:
        outcome = {"passed": 0, "total": 1, "failure": _describe(exc)}
    link.close()
    import signal

    with contextlib.suppress(OSError):
        os.kill(worker, signal.SIGKILL)
    os.waitpid(worker, 0)
    _send_report(key, outcome)


def _not_dumpable() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def _drive_check(entry_point: str, link: _Link) -> dict[str, Any]:
    import builtins

    # Imports from here on must not find files the candidate may write into its workdir.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if p not in ("", ".", here, os.getcwd())]
    # Both files go before the worker runs anything: it never sees the tests.
    code = _take_source("tests.py")
    context = _take_source("context.py") if os.path.exists("context.py") else None
    namespace: dict[str, Any] = {"__name__": "solution", "__builtins__": builtins}
    if context is not None:
        # The task's own prompt (trusted): its helpers (HumanEval's poly, encode_cyclic)
        # and imports are the ones the tests meant, not whatever the candidate redefined.
        exec(context, namespace)
    # From the candidate: the entry point, plus names the tests use that neither the prompt
    # nor the built-ins provide. Never a built-in: a candidate's own ``abs`` or ``len``
    # must not replace the one the tests compare with.
    wanted = {
        name for name in _names_used(code) if name not in namespace and not hasattr(builtins, name)
    } | {entry_point}
    link.send({"names": sorted(wanted)})
    reply = link.receive()
    if not isinstance(reply, dict):
        raise CandidateGone("the code ended its process before the tests ran")
    if "error" in reply:
        return {"passed": 0, "total": 1, "failure": str(reply["error"])}
    offered = reply.get("names")
    if not isinstance(offered, dict):
        raise CandidateGone("the candidate's process sent an unreadable reply")
    if offered.get(entry_point) != ["fn"]:
        raise NameError(f"the code does not define {entry_point!r}")
    for name in wanted:
        value = _materialise(name, offered.get(name), link)
        if value is not _MISSING:
            namespace[name] = value
    exec(code, namespace)
    namespace["check"](namespace[entry_point])
    return {"passed": 1, "total": 1, "failure": None}


def _take_source(name: str) -> Any:
    """Compile ``name`` from the workdir and delete the file; tracebacks still quote it."""
    import linecache

    with open(name, encoding="utf-8") as fh:
        source = fh.read()
    os.unlink(name)
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    return compile(source, name, "exec")


_MISSING = object()


def _names_used(code: Any) -> set[str]:
    """Every global (and attribute) name the test program's code objects mention."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names_used(const)
    return names


def _materialise(name: str, spec: Any, link: _Link) -> Any:
    """The driver's stand-in for one name of the candidate's namespace."""
    if not isinstance(spec, list) or not spec:
        return _MISSING
    if spec[0] == "fn":
        return _proxy(name, link)
    if spec[0] == "mod" and len(spec) == 2 and spec[1] == name:
        # A module the candidate imported (``import math``): the driver imports its own
        # copy, only from the standard library and only under its own name.
        if name in sys.stdlib_module_names:
            import importlib

            try:
                return importlib.import_module(spec[1])
            except ImportError:
                return _MISSING
        return _MISSING
    if spec[0] == "data" and len(spec) == 2:
        try:
            return decode(spec[1])
        except (ValueError, RecursionError):
            return _MISSING
    return _MISSING


def _proxy(name: str, link: _Link) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            request = {"call": name, "args": encode(list(args)), "kwargs": encode(kwargs)}
        except TypeError as exc:
            raise TypeError(f"the test passes a value the sandbox cannot send: {exc}") from None
        link.send(request)
        reply = link.receive()
        if not isinstance(reply, dict):
            raise CandidateGone(f"the code ended its process during a call to {name}()")
        if "value" in reply:
            try:
                return decode(reply["value"])
            except (ValueError, RecursionError) as exc:
                raise CandidateGone(f"{name}() returned an unreadable value: {exc}") from None
        raise _rebuild_exception(reply.get("raise"))

    call.__name__ = call.__qualname__ = name
    return call


def _rebuild_exception(spec: Any) -> BaseException:
    """The candidate's exception as the same built-in type, so ``except ValueError`` in a
    test still works; its text was written in the worker (the driver has no traceback)."""
    import builtins

    if not (isinstance(spec, list) and len(spec) == 2 and all(isinstance(x, str) for x in spec)):
        return CandidateGone("the candidate's process sent an unreadable reply")
    kind = getattr(builtins, spec[0], None)
    exc: BaseException
    try:
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            raise TypeError
        exc = kind(spec[1])
    except Exception:
        exc = CandidateGone(spec[1])
    exc.sandbox_description = spec[1]  # type: ignore[attr-defined]
    return exc


def _serve_candidate(link: _Link, allow_subprocesses: bool) -> None:
    """The worker: wait for the driver, load the candidate, answer calls until EOF."""
    request = link.receive()  # the driver sends it once tests.py is gone
    if not isinstance(request, dict) or not isinstance(request.get("names"), list):
        return
    _guard(allow_subprocesses)
    module = _module("solution")
    sys.modules["solution"] = module
    try:
        exec(_compile("solution.py"), module.__dict__)
    except BaseException as exc:  # SystemExit too: exiting early is not passing
        _flush_output()
        link.send({"error": _describe(exc)})
        return
    _flush_output()
    space = module.__dict__
    link.send({"names": {n: _offer(space[n]) for n in request["names"] if n in space}})
    while True:
        request = link.receive()
        if not isinstance(request, dict):
            return
        try:
            args, kwargs = decode(request["args"]), decode(request["kwargs"])
            value = space[request["call"]](*args, **kwargs)
        except BaseException as exc:  # SystemExit too: it ends the call, not the tests
            _flush_output()
            link.send({"raise": [type(exc).__name__, _describe(exc)]})
            continue
        try:
            reply = {"value": encode(value)}
        except TypeError as exc:
            why = f"returned {type(value).__name__}, which is not plain data ({exc})"
            reply = {"raise": ["TypeError", f"TypeError: {why}"]}
        _flush_output()  # the driver kills this process once the tests end
        link.send(reply)


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _offer(value: Any) -> list[Any]:
    import types

    if isinstance(value, types.ModuleType):
        return ["mod", value.__name__]
    if callable(value):
        return ["fn"]
    try:
        return ["data", encode(value)]
    except TypeError:
        return ["other"]


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


def _main() -> None:
    import json

    _restore_exit()
    mode = json.loads(sys.argv[1])
    allow = os.environ.pop("SANDBOX_ALLOW_SUBPROCESSES", None) == "1"
    if mode[0] == "check":
        _run_check(mode[1], allow)  # installs the guard in the worker, after its fork
        return
    key = _read_key() if mode[0] in ("tests", "call") else b""
    _guard(allow)
    if mode[0] == "tests":
        _run_unittests(key)
    elif mode[0] == "call":
        _run_call(mode[1], key)
    else:
        _run_script()


if __name__ == "__main__":
    _main()
