"""The program the sandboxed interpreter runs: load the candidate, run it, report a verdict.

``sandbox_process`` copies this file into the run's working directory, next to the modules it
imports from there (``sandbox_child``: loading the candidate and the verdict channel;
``sandbox_check``: check mode's two processes; ``sandbox_plain``), and the launcher
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

import os
import sys

try:  # in the sandbox: the copies next to this file (the package is not importable there)
    from sandbox_check import run_check
    from sandbox_child import (
        candidate_module,
        compile_file,
        describe,
        guard,
        read_key,
        restore_exit,
        send_report,
    )
except ImportError:  # imported as part of the package (tests)
    from conductor_pipeline.tasks.sandbox_check import run_check
    from conductor_pipeline.tasks.sandbox_child import (
        candidate_module,
        compile_file,
        describe,
        guard,
        read_key,
        restore_exit,
        send_report,
    )


# --------------------------------------------------------------------------------------
# Modes that run the candidate in this process
# --------------------------------------------------------------------------------------


def _run_script() -> None:
    module, code = candidate_module("__main__"), compile_file("solution.py")
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
        module = candidate_module("solution")
        sys.modules["solution"] = module
        exec(compile_file("solution.py"), module.__dict__)
        exec(compile_file("tests.py"), module.__dict__)
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
        outcome = {"passed": 0, "total": 1, "failure": describe(exc)}
    send_report(key, outcome)


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
        module = candidate_module("solution")
        sys.modules["solution"] = module
        exec(compile(_CALL_PRELUDE, "<prelude>", "exec"), module.__dict__)
        sys.setrecursionlimit(20000)  # recursive DFS is idiomatic on LeetCode
        exec(compile_file("solution.py"), module.__dict__)
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
        report = {"error": describe(exc)}
    send_report(key, report)


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


def _main() -> None:
    import json

    restore_exit()
    mode = json.loads(sys.argv[1])
    allow = os.environ.pop("SANDBOX_ALLOW_SUBPROCESSES", None) == "1"
    if mode[0] == "check":
        run_check(mode[1], allow)  # installs the guard in the worker, after its fork
        return
    key = read_key() if mode[0] in ("tests", "call") else b""
    guard(allow)
    if mode[0] == "tests":
        _run_unittests(key)
    elif mode[0] == "call":
        _run_call(mode[1], key)
    else:
        _run_script()


if __name__ == "__main__":
    _main()
