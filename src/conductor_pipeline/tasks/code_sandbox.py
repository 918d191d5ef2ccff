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
* ``reaper``    - (without a PID namespace) launcher and init are child subreapers: a process
  the child detached (``setsid``, double fork) is adopted by init and killed before the run
  ends; a run cut short has the launcher's whole tree stopped, then killed. A child under
  the same uid as init (no fresh uid) can still kill init and the launcher first, and what it
  detached then survives; ``sandbox_launcher`` explains.
* ``uid``       - (root) the child runs under a fresh, unused uid. Linux does not enforce
  RLIMIT_NPROC for uid 0, so dropping root is what actually caps a fork bomb; a per-run uid
  (instead of the shared ``nobody``) keeps concurrent runs from eating each other's process
  quota or signalling each other, and lets us sweep up leftovers by uid.
* ``preamble``  - Python-level guard run before the candidate: internet sockets, and by
  default process creation, raise ``PermissionError``. It is a second layer only (ctypes
  or ``_socket`` get round it), useful where the kernel layers are unavailable.
* ``cleanenv``  - the environment is built from scratch, so secrets in ``os.environ`` (API
  keys) never reach the child.

Without root (a developer laptop, an unprivileged CI runner) only session, rlimits, reaper,
preamble and cleanenv are available; RLIMIT_NPROC is then set relative to the user's
current process count.

The work is split over these modules: this one (the public runners and how a test verdict
is read), on the parent side ``sandbox_process`` (run one, interpret what happened),
``sandbox_setup`` (limits, working directory, the launcher's configuration) and
``sandbox_watch`` (read the output, kill what is left), ``sandbox_launcher`` (privileged
set-up in a fresh process, run as a script), and in the candidate's interpreter
``sandbox_harness`` (the program it runs), ``sandbox_child`` (what its modes share),
``sandbox_check`` (HumanEval's two-process check) and ``sandbox_plain`` (the plain-data
codec of that check). Why a test verdict cannot be
forged by the code under test, and where that stops, is explained in ``sandbox_harness``.

Interpreter flags for the candidate: ``-s -S -B``. ``-S`` (no ``site``) keeps third-party
packages and their ``.pth`` start-up hooks out of the child and saves start-up time;
HumanEval and LiveCodeBench need only the standard library. BigCodeBench needs numpy and
friends, hence ``site_packages=True`` (its loader asks for it per task); every other layer
applies unchanged. We do not use ``-I``/``-E``: they would make the
child ignore ``PYTHONHASHSEED``, which we set so that set/dict-order-dependent output is
reproducible; since the environment is built from scratch, ``-E`` would protect nothing.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conductor_pipeline.tasks.sandbox_process import SandboxResult, execute
from conductor_pipeline.tasks.sandbox_setup import (
    ARGS_FILE,
    CONTEXT_FILE,
    SOLUTION_FILE,
    TEST_FILE,
    SandboxLimits,
)

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
    "same_json_value",
]


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
    result, _ = execute({SOLUTION_FILE: code}, ["script"], stdin, limits, want_report=False)
    return result


def run_function_tests(
    code: str,
    test: str,
    entry_point: str | None = None,
    *,
    limits: SandboxLimits | None = None,
    context: str | None = None,
) -> TestReport:
    """Run a HumanEval/BigCodeBench-style test program against candidate ``code``.

    If ``test`` defines ``check`` and ``entry_point`` is given, ``check(entry_point)`` is the
    single test (HumanEval). It runs in a process of its own that never runs candidate code:
    the candidate's functions are called in a second process and only plain data (None,
    bool, numbers, str, bytes, and lists, tuples, dicts and sets of them) crosses between the
    two, so the candidate sees neither the tests nor the expected values, and an object
    whose ``__eq__`` always answers True never reaches a comparison. ``context`` is trusted
    source (the task's prompt) run in the test process first: the tests then use its
    helpers and imports, and take only the entry point (and names neither it nor the
    built-ins define) from the candidate, so redefining a helper the tests call, or a
    built-in such as ``abs``, changes nothing.

    Otherwise every ``unittest.TestCase`` defined by ``test`` is run in the candidate's own
    process and the pass fraction counts individual test methods (BigCodeBench, whose tests
    patch the candidate's modules and inspect rich objects such as DataFrames). A candidate
    written to attack that harness from the inside can subvert it; see ``sandbox_harness``.

    In both styles the verdict is written by the harness, after the tests, signed with a key
    the parent made for this run; a candidate that exits early or writes to the report pipe
    does not pass.
    """
    limits = limits or SandboxLimits()
    mode = "check" if entry_point and _defines_check(test) else "tests"
    files = {SOLUTION_FILE: code, TEST_FILE: test}
    if mode == "check" and context and _compiles(context):
        files[CONTEXT_FILE] = context
    result, report = execute(files, [mode, entry_point or ""], "", limits, want_report=True)
    if report is None:
        failure = (
            result.reason
            if not result.ok
            else "the test harness did not finish (did the code exit early?)"
        )
        return TestReport(passed=0, total=1, first_failure=failure, runs=(result,))
    passed, total = _count(report.get("passed")), _count(report.get("total"))
    failure = report.get("failure")
    failure = None if failure is None else str(failure)
    if not result.ok and passed == total:
        # The tests passed but the process then failed (e.g. timed out while exiting).
        passed, failure = 0, result.reason
    if total == 0:
        failure = failure or "no tests were found"
    return TestReport(passed=min(passed, total), total=total, first_failure=failure, runs=(result,))


def _defines_check(test: str) -> bool:
    """Whether the test program defines a top-level ``check`` function (HumanEval style)."""
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError):
        return False  # the in-process harness reports the error as the failure
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "check"
        for node in tree.body
    )


def _compiles(source: str) -> bool:
    # A prompt whose stub has no body (bare starter code) is no usable context.
    try:
        compile(source, "context.py", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


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
        result, _ = execute(
            {SOLUTION_FILE: code},
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
    can pass a case. The comparison is :func:`same_json_value`: ``True`` does not answer an
    expected ``1`` (nor ``1`` an expected ``true``), unlike the ``==`` of LiveCodeBench's own
    checker, because a JSON judge such as LeetCode's tells them apart.
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
            result, report = execute(
                {SOLUTION_FILE: code, ARGS_FILE: json.dumps(args)},
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
            elif not same_json_value(report.get("value"), expected):
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


def same_json_value(actual: Any, expected: Any) -> bool:
    """Whether two decoded JSON values are the same answer: Python's ``==``, except that a
    boolean equals only a boolean (``True == 1`` in Python, but ``true`` and ``1`` are
    different JSON values). Numbers still compare by value (``2.0`` answers ``2``), as
    LiveCodeBench's checker does. Iterative: a deeply nested reply cannot exhaust the stack.
    """
    pending = [(actual, expected)]
    while pending:
        left, right = pending.pop()
        if isinstance(left, bool) or isinstance(right, bool):
            if not (isinstance(left, bool) and isinstance(right, bool) and left == right):
                return False
        elif isinstance(left, list) or isinstance(right, list):
            if not (isinstance(left, list) and isinstance(right, list)):
                return False
            if len(left) != len(right):
                return False
            pending.extend(zip(left, right, strict=True))
        elif isinstance(left, dict) or isinstance(right, dict):
            if not (isinstance(left, dict) and isinstance(right, dict)):
                return False
            if left.keys() != right.keys():
                return False
            pending.extend((left[key], right[key]) for key in right)
        elif left != right:
            return False
    return True


def compare_stdout(actual: str, expected: str) -> bool:
    """Whether two program outputs agree, ignoring blank edges and runs of whitespace."""
    return _normalise_output(actual) == _normalise_output(expected)


def _normalise_output(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.strip().splitlines()]


def _preview(text: str, limit: int = 80) -> str:
    text = str(text).strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")
