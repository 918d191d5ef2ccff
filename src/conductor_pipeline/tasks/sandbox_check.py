"""check mode of the sandbox harness (HumanEval): the driver runs the tests, the worker
runs the candidate, in two processes that exchange plain data only.

``sandbox_harness`` explains why: the verdict is decided and signed in the driver, which
never runs candidate code, from values it decoded itself. Copied next to the harness into
the run's working directory; standard library only and importable without side effects.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

try:  # in the sandbox: the copies next to this file (the package is not importable there)
    from sandbox_child import (
        KEY_FD,
        REPORT_FD,
        candidate_module,
        compile_file,
        describe,
        flush_output,
        guard,
        read_key,
        send_report,
    )
    from sandbox_plain import decode, encode
except ImportError:  # imported as part of the package (tests)
    from conductor_pipeline.tasks.sandbox_child import (
        KEY_FD,
        REPORT_FD,
        candidate_module,
        compile_file,
        describe,
        flush_output,
        guard,
        read_key,
        send_report,
    )
    from conductor_pipeline.tasks.sandbox_plain import decode, encode

# Largest message between driver and worker; a bigger one is refused, not buffered.
_MAX_MESSAGE = 32 * 1024 * 1024


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


def run_check(entry_point: str, allow_subprocesses: bool) -> None:
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
    key = read_key()  # after the fork: the worker's copy of our memory has no key
    link = _Link(to_driver_r, to_worker_w)
    try:
        outcome = _drive_check(entry_point, link)
    except BaseException as exc:
        outcome = {"passed": 0, "total": 1, "failure": describe(exc)}
    link.close()
    import signal

    with contextlib.suppress(OSError):
        os.kill(worker, signal.SIGKILL)
    os.waitpid(worker, 0)
    send_report(key, outcome)


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
    guard(allow_subprocesses)
    module = candidate_module("solution")
    sys.modules["solution"] = module
    try:
        exec(compile_file("solution.py"), module.__dict__)
    except BaseException as exc:  # SystemExit too: exiting early is not passing
        flush_output()
        link.send({"error": describe(exc)})
        return
    flush_output()
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
            flush_output()
            link.send({"raise": [type(exc).__name__, describe(exc)]})
            continue
        try:
            reply = {"value": encode(value)}
        except TypeError as exc:
            why = f"returned {type(value).__name__}, which is not plain data ({exc})"
            reply = {"raise": ["TypeError", f"TypeError: {why}"]}
        flush_output()  # the driver kills this process once the tests end
        link.send(reply)


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
