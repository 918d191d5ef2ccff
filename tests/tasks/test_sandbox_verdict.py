"""A test verdict from the code sandbox cannot be forged by the code under test (issue 15).

The attacks are written as a policy could write them: the candidate tries to write a
passing report wherever a report could go (descriptors named in argv, every open
descriptor, every process's descriptors under /proc), signs it with any 32-byte secret it
can find (frames, gc, files), peeks at the tests, or returns an object that claims to equal
anything. Each must be scored wrong (correct=False, score 0), while honest solutions,
including ones returning subclasses of plain types, still score 1.0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import math
from collections import Counter, OrderedDict, namedtuple
from typing import Any

import pytest

from conductor_pipeline.tasks import Task, sandbox_child, sandbox_launcher, verify
from conductor_pipeline.tasks.code_sandbox import SandboxLimits, run_function_tests
from conductor_pipeline.tasks.sandbox_plain import decode, encode
from conductor_pipeline.tasks.sandbox_process import read_report

LIMITS = SandboxLimits(wall_timeout_s=5, cpu_time_s=5)
PROMPT = 'def add(a: int, b: int) -> int:\n    """Return a + b."""\n'
CHECK = (
    "def check(candidate):\n"
    "    assert candidate(1, 2) == 3\n"
    "    assert candidate(-1, 1) == 0\n"
    "    assert candidate(20, 22) == 42\n"
)
UNITTESTS = (
    "import unittest\n"
    "class TestCases(unittest.TestCase):\n"
    "    def test_small(self):\n        self.assertEqual(add(1, 2), 3)\n"
    "    def test_big(self):\n        self.assertEqual(add(20, 22), 42)\n"
)


def _task(test: str = CHECK) -> Task:
    return Task(
        id="forge",
        domain="code",
        difficulty="easy",
        question="Write add.",
        answer="return a + b",
        answer_format="code",
        verifier="code",
        source="unit-test",
        metadata={"entry_point": "add", "prompt": PROMPT, "test": test, "timeout_s": 5},
    )


def _fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}```\n"


def _assert_wrong(code: str, test: str = CHECK) -> None:
    verdict = verify(_task(test), _fenced(code))
    assert not verdict.correct and verdict.score == 0.0, verdict


# A forger that tries every channel it can think of. ``SEARCH_KEYS`` decides whether it
# also hunts for the run's key in memory (frames, gc) and signs its report with it.
FORGER = r"""
import gc, hashlib, hmac, json, os, sys

def _candidate_keys():
    keys = []
    frame = sys._getframe()
    while frame is not None:  # every frame up the stack, locals and globals
        for space in (frame.f_locals, frame.f_globals):
            keys += [v for v in list(space.values()) if isinstance(v, bytes) and len(v) == 32]
        frame = frame.f_back
    for obj in gc.get_objects():  # every container the collector knows
        try:
            values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
            keys += [v for v in values if isinstance(v, bytes) and len(v) == 32]
        except Exception:
            pass
    for fd in (3, 4):  # the key pipe, if it were still open
        try:
            data = os.read(fd, 64)
            if len(data) == 32:
                keys.append(data)
        except OSError:
            pass
    return list(dict.fromkeys(keys))

def _forge():
    fake = json.dumps({"passed": 1, "total": 1, "failure": None})
    keys = _candidate_keys() if SEARCH_KEYS else []
    key = keys[0] if keys else b"\0" * 32
    mac = hmac.new(key, fake.encode(), hashlib.sha256).hexdigest()
    line = (json.dumps({"report": fake, "mac": mac}) + "\n").encode()
    old = (fake + "\n").encode()  # the report format before signing
    fds = {int(a) for a in sys.argv[1:] if a.isdigit()}  # the old channel: its number in argv
    try:
        fds |= {int(x) for x in os.listdir("/proc/self/fd")}
    except OSError:
        pass
    fds |= set(range(3, 32))
    for fd in sorted(fds - {0, 1, 2}):
        for payload in (line, old):
            try:
                os.write(fd, payload)
            except OSError:
                pass
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:  # other processes' pipes
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in names:
            try:
                fd = os.open(f"/proc/{pid}/fd/{name}", os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                os.write(fd, line)
            except OSError:
                pass
            os.close(fd)
    os._exit(0)
"""


@pytest.mark.parametrize("search_keys", [False, True], ids=["blind", "with-key-hunt"])
@pytest.mark.parametrize("when", ["at-import", "in-call"])
def test_forged_reports_are_scored_wrong_in_check_mode(search_keys: bool, when: str) -> None:
    body = "    return 0\n" if when == "at-import" else "    _forge()\n"
    code = f"SEARCH_KEYS = {search_keys}\n" + FORGER + PROMPT + body
    if when == "at-import":
        code += "_forge()\n"
    _assert_wrong(code)


def test_blind_forgery_is_scored_wrong_in_unittest_mode() -> None:
    # In-process mode (BigCodeBench): the key is read and its descriptor closed before the
    # candidate loads, so writing to descriptors does not pass. (Hunting the key in memory
    # can succeed here; the harness's docstring says why that mode accepts it.)
    code = "SEARCH_KEYS = False\n" + FORGER + PROMPT + "    return a + b\n_forge()\n"
    report = run_function_tests(code, UNITTESTS, limits=LIMITS)
    assert not report.all_passed and report.fraction == 0.0, report


def test_the_old_argv_channel_is_gone() -> None:
    # The attack from the issue: the report pipe's number was the last argv entry.
    cheat = (
        "import os, sys\n"
        "for arg in sys.argv[1:]:\n"
        "    if arg.isdigit():\n"
        '        os.write(int(arg), b\'{"passed": 1, "total": 1, "failure": null}\\n\')\n'
        "os._exit(0)\n"
    )
    _assert_wrong(PROMPT + "    return 0\n" + cheat)


def test_the_candidate_holds_neither_channel_nor_key() -> None:
    # The candidate passes only if, inside its process, descriptors 3 and 4 are closed,
    # argv names no descriptor and its parent's descriptors are out of reach.
    probe = (
        PROMPT
        + "    import os, sys\n"
        + "    for fd in (3, 4):\n"
        + "        try:\n"
        + "            os.fstat(fd)\n"
        + "            return -1\n"
        + "        except OSError:\n"
        + "            pass\n"
        + "    if any(arg.isdigit() for arg in sys.argv):\n"
        + "        return -2\n"
        + "    try:\n"  # the test driver (our parent) is non-dumpable: no /proc way in
        + "        os.listdir(f'/proc/{os.getppid()}/fd')\n"
        + "        return -3\n"
        + "    except OSError:\n"
        + "        pass\n"
        + "    return a + b\n"
    )
    assert run_function_tests(probe, CHECK, "add", limits=LIMITS).all_passed
    assert sandbox_child.REPORT_FD == sandbox_launcher.REPORT_FD
    assert sandbox_child.KEY_FD == sandbox_launcher.KEY_FD


def test_peeking_at_the_tests_does_not_pass() -> None:
    # Read the expected values from tests.py, or from the caller's code object; both worked
    # while the tests ran in the candidate's process.
    peek = (
        PROMPT
        + "    import re, sys\n"
        + "    try:\n"
        + "        text = open('tests.py').read()\n"
        + "    except OSError:\n"
        + "        text = ''\n"
        + "    for args, value in re.findall(r'candidate\\((.*?)\\) == (\\S+)', text):\n"
        + "        if eval('(' + args + ',)') == (a, b):\n"
        + "            return int(value)\n"
        + "    consts = [c for c in sys._getframe(1).f_code.co_consts if isinstance(c, int)]\n"
        + "    return consts[-1] if consts else 0\n"
    )
    _assert_wrong(peek)


def test_shadowing_what_the_tests_call_does_not_pass() -> None:
    # HumanEval/32 style: the tests judge the answer with a helper from the prompt (and a
    # built-in). A candidate that redefines both so that any answer looks right is wrong.
    prompt = (
        "def poly(xs, x):\n    return sum(c * x**i for i, c in enumerate(xs))\n\n"
        'def find_zero(xs):\n    """A root of the polynomial xs."""\n'
    )
    test = (
        "def check(candidate):\n"
        "    assert abs(poly([-2, 1], candidate([-2, 1]))) < 1e-6\n"
        "    assert abs(poly([-6, 1], candidate([-6, 1]))) < 1e-6\n"
    )
    metadata = {"entry_point": "find_zero", "prompt": prompt, "test": test, "timeout_s": 5}
    task = dataclasses.replace(_task(), metadata=metadata)
    honest = "    return -xs[0] / xs[1]\n"
    verdict = verify(task, _fenced(prompt + honest))
    assert verdict.correct and verdict.score == 1.0, verdict
    cheat = "    return 0.0\ndef poly(xs, x):\n    return 0\ndef abs(x):\n    return 0\n"
    verdict = verify(task, _fenced(prompt + cheat))
    assert not verdict.correct and verdict.score == 0.0, verdict
    # Without the prompt as context the helper comes from the candidate; built-ins never do.
    only_abs = "    return 0.0\ndef abs(x):\n    return 0\n"
    assert not run_function_tests(prompt + only_abs, test, "find_zero", limits=LIMITS).all_passed


ALWAYS_EQUAL = {
    "object": "class Anything:\n    def __eq__(self, other):\n        return True\n",
    "int-subclass": "class Anything(int):\n    def __eq__(self, other):\n        return True\n",
    "str-subclass": "class Anything(str):\n    def __eq__(self, other):\n        return True\n",
    "list-subclass": "class Anything(list):\n    def __eq__(self, other):\n        return True\n",
}


@pytest.mark.parametrize("kind", sorted(ALWAYS_EQUAL))
def test_an_always_equal_result_is_scored_wrong(kind: str) -> None:
    code = ALWAYS_EQUAL[kind] + PROMPT + "    return Anything()\n"
    _assert_wrong(code)


def test_a_correct_solution_still_scores_one() -> None:
    verdict = verify(_task(), _fenced(PROMPT + "    return a + b\n"))
    assert verdict.correct and verdict.score == 1.0, verdict
    verdict = verify(_task(UNITTESTS), _fenced(PROMPT + "    return a + b\n"))
    assert verdict.correct and verdict.score == 1.0, verdict


def test_honest_results_of_plain_subclasses_and_helpers_pass() -> None:
    # Counter/OrderedDict compare equal to dicts, namedtuples to tuples: as in-process.
    code = (
        "import math\n"
        "from collections import Counter, namedtuple\n"
        "Pair = namedtuple('Pair', 'low high')\n"
        "SCALE = 10\n"
        "def helper(x):\n    return x * SCALE\n"
        "def histogram(text):\n"
        "    if text == 'boom':\n        raise ValueError('no booms')\n"
        "    return Counter(text.split())\n"
        "def bounds(xs):\n    return Pair(min(xs), max(xs))\n"
    )
    test = (
        "def check(candidate):\n"
        "    assert candidate('a b a') == {'a': 2, 'b': 1}\n"
        "    assert bounds([3, 1, 2]) == (1, 3)\n"
        "    assert helper(2) == 2 * SCALE == 20\n"
        "    assert math.isclose(math.pi, 3.14159, rel_tol=1e-5)\n"
        "    try:\n        candidate('boom')\n    except ValueError:\n        pass\n"
        "    else:\n        raise AssertionError('expected ValueError')\n"
    )
    report = run_function_tests(code, test, "histogram", limits=LIMITS)
    assert report.all_passed, report


def test_a_failing_assert_is_named_in_the_failure() -> None:
    report = run_function_tests(PROMPT + "    return a - b\n", CHECK, "add", limits=LIMITS)
    assert report.fraction == 0.0
    assert "assert candidate(1, 2) == 3" in (report.first_failure or "")


# --------------------------------------------------------------------------------------
# The pieces: plain-data codec and report authentication
# --------------------------------------------------------------------------------------

PLAIN_VALUES = [
    None,
    True,
    0,
    -(2**80),
    2**53,
    1.5,
    float("inf"),
    -0.0,
    3 + 4j,
    "text",
    b"\x00bytes",
    bytearray(b"ab"),
    [1, [2, (3, "x")]],
    (1,),
    {"a": 1, 2: [3], (4, 5): None},
    {1, 2, frozenset({3})},
    frozenset(),
]


@pytest.mark.parametrize("value", PLAIN_VALUES, ids=repr)
def test_plain_values_round_trip_exactly(value: Any) -> None:
    back = decode(json.loads(json.dumps(encode(value))))
    assert back == value and type(back) is type(value)


def test_nan_round_trips() -> None:
    assert math.isnan(decode(json.loads(json.dumps(encode(float("nan"))))))


def test_subclasses_are_reduced_to_their_plain_base() -> None:
    Point = namedtuple("Point", "x y")
    assert type(decode(encode(Point(1, 2)))) is tuple
    assert decode(encode(Counter("aab"))) == {"a": 2, "b": 1}
    assert type(decode(encode(OrderedDict(a=1)))) is dict


@pytest.mark.parametrize(
    "value",
    [object(), len, iter([1]), [1, object()], {"k": type}, range(3)],
    ids=["object", "function", "iterator", "nested", "class", "range"],
)
def test_non_plain_values_are_refused(value: Any) -> None:
    with pytest.raises(TypeError, match="not plain data"):
        encode(value)


@pytest.mark.parametrize(
    "data",
    [1.5, ["?", "x"], ["l", 1], ["d", [[["l", []], 1]]], ["s", [["l", []]]], ["i", "zz"], {}],
    ids=[
        "bare-float",
        "unknown-tag",
        "bad-list",
        "unhashable-key",
        "unhashable-item",
        "bad-int",
        "object",
    ],
)
def test_decode_refuses_malformed_data(data: Any) -> None:
    with pytest.raises(ValueError):
        decode(data)


def test_decode_refuses_deep_nesting() -> None:
    data: Any = ["l", []]
    for _ in range(500):
        data = ["l", [data]]
    with pytest.raises(ValueError, match="nested too deeply"):
        decode(data)


def _signed(key: bytes, report: dict[str, Any]) -> bytes:
    body = json.dumps(report)
    mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
    return (json.dumps({"report": body, "mac": mac}) + "\n").encode()


def test_read_report_accepts_only_one_line_signed_with_the_run_key() -> None:
    key, other = b"k" * 32, b"o" * 32
    good = {"passed": 1, "total": 1, "failure": None}
    assert read_report(_signed(key, good), key) == good
    assert read_report(_signed(other, good), key) is None  # wrong key
    assert read_report(b'{"passed": 1, "total": 1}\n', key) is None  # unsigned (old format)
    assert read_report(_signed(key, good) * 2, key) is None  # a second line voids it
    assert read_report(b"garbage\n" + _signed(key, good), key) is None
    assert read_report(_signed(key, good), b"") is None  # no key, no report


# --------------------------------------------------------------------------------------
# Without root: no fresh uid, the candidate shares the caller's uid
# --------------------------------------------------------------------------------------

UNPRIVILEGED_DRIVER = r"""
import json, os, sys, types
for name in ("conductor_pipeline", "conductor_pipeline.tasks"):
    package = sys.modules[name] = types.ModuleType(name)
    package.__path__ = [SRC + "/" + name.replace(".", "/")]
from conductor_pipeline.tasks.code_sandbox import SandboxLimits, run_function_tests
probe = PROMPT + (
    "    import os\n"
    "    reachable = []\n"
    "    for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
    "        try:\n"
    "            os.listdir(f'/proc/{pid}/fd')\n"
    "        except OSError:\n"
    "            continue\n"
    "        reachable.append(int(pid))\n"
    "    print(json.dumps([os.getpid(), sorted(reachable)]))\n"
    "    return a + b\n"
)
report = run_function_tests("import json\n" + probe, CHECK, "add", limits=SandboxLimits(wall_timeout_s=10))
run = report.runs[0]
candidate, seen = json.loads(run.stdout.splitlines()[0]) if run.stdout else (None, None)
print(json.dumps({"passed": report.all_passed, "isolation": run.isolation, "me": os.getpid(),
                  "candidate": candidate, "seen": seen}))
"""


def test_unprivileged_runs_keep_launcher_and_driver_out_of_reach(tmp_path: Any) -> None:
    """As an ordinary user the candidate can see its uid's processes in /proc; of the
    sandbox's own processes (launcher, init, test driver) none may expose its descriptors."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    python = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or shutil.which("setpriv") is None or python is None:
        pytest.skip("needs root (to drop to nobody), setpriv and a system python3")
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info >= (3, 11))"],
        capture_output=True,
        text=True,
        check=False,
    )
    if version.stdout.strip() != "True":
        pytest.skip("the system python3 is older than 3.11")
    src = Path(__file__).resolve().parents[2] / "src"
    script = f"SRC = {str(src)!r}\nPROMPT = {PROMPT!r}\nCHECK = {CHECK!r}\n" + UNPRIVILEGED_DRIVER
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        check=False,
    )
    if done.returncode != 0 and "Permission denied" in done.stderr:
        pytest.skip(f"nobody cannot read the checkout: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert "uid" not in outcome["isolation"], outcome
    assert outcome["passed"], outcome
    # Only the candidate itself and the caller (same uid, outside the sandbox) are
    # reachable; launcher, init and the check driver are non-dumpable.
    assert sorted(outcome["seen"]) == sorted({outcome["me"], outcome["candidate"]}), outcome
