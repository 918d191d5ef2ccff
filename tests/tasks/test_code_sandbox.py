"""The code sandbox: ordinary runs, the two test styles, and hostile programs.

Each hostile test checks three things: the run is reported as a failure with a reason, the
damage did not happen (no file, no connection, no leaked secret, no leftover process), and
this test process is fine afterwards. Limits are kept small so the whole file stays fast.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conductor_pipeline.tasks.code_sandbox import (
    SandboxLimits,
    compare_stdout,
    parse_call_arguments,
    run_call_tests,
    run_function_tests,
    run_python,
    run_stdio_tests,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
FAST = {"wall_timeout_s": 3, "cpu_time_s": 3}


@pytest.fixture(scope="module")
def isolation() -> tuple[str, ...]:
    """The containment layers this machine offers (root gets the kernel ones)."""
    result = run_python("pass")
    assert result.ok, result
    return result.isolation


def _live_processes(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
            pids.append(int(entry))
    return pids


def _assert_nothing_left(uid: int | None) -> None:
    assert uid is not None
    deadline = time.monotonic() + 2
    while _live_processes(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _live_processes(uid) == []


def _assert_parent_healthy() -> None:
    # The test process can still create processes and files.
    assert subprocess.run(["true"], check=False).returncode == 0
    assert run_python("print(6 * 7)").stdout.strip() == "42"


# --------------------------------------------------------------------------------------
# Ordinary programs
# --------------------------------------------------------------------------------------


def test_runs_code_and_captures_stdout_and_stdin() -> None:
    result = run_python("import sys\nprint(sys.stdin.read().upper())", stdin="hello\n")
    assert result.ok and result.passed
    assert result.returncode == 0
    assert result.stdout.strip() == "HELLO"
    assert result.reason is None


def test_exception_gives_exit_code_and_last_stderr_line() -> None:
    result = run_python("print('partial')\nraise ValueError('bad input')")
    assert not result.ok
    assert result.returncode == 1
    assert result.reason == "exited with code 1: ValueError: bad input"
    assert "partial" in result.stdout  # output before the crash is kept
    assert 'File "solution.py", line 2' in result.stderr


def test_sys_exit_code_is_reported() -> None:
    result = run_python("import sys\nsys.exit(3)")
    assert result.returncode == 3 and not result.ok
    assert result.reason == "exited with code 3"


def test_exit_and_quit_builtins_exist() -> None:
    # -S skips the site module that normally defines them.
    assert run_python("print(1)\nexit()").ok
    assert run_python("quit(4)").returncode == 4


def test_closing_output_early_does_not_end_the_run() -> None:
    code = "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(0.5)\nraise SystemExit(5)"
    assert run_python(code, **FAST).returncode == 5
    silent_loop = "import os\nos.close(1)\nos.close(2)\nwhile True:\n    pass"
    assert run_python(silent_loop, wall_timeout_s=1).reason == "timed out after 1 s"


def test_hash_seed_is_fixed() -> None:
    code = "print(hash('conductor'))"
    assert run_python(code).stdout == run_python(code).stdout


def test_concurrent_runs_from_threads(isolation: tuple[str, ...]) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda i: run_python(f"print({i} * 2)"), range(4)))
    assert [r.stdout.strip() for r in results] == ["0", "2", "4", "6"]
    if "uid" in isolation:
        assert len({r.uid for r in results}) == 4  # a fresh uid per run


def test_mounts_do_not_leak_into_the_host() -> None:
    before = Path("/proc/self/mountinfo").read_text()
    run_python("open('/tmp/x', 'w').write('x')")
    assert Path("/proc/self/mountinfo").read_text() == before


# --------------------------------------------------------------------------------------
# Hostile programs
# --------------------------------------------------------------------------------------


def test_infinite_loop_is_killed_at_the_wall_timeout() -> None:
    started = time.monotonic()
    result = run_python("while True:\n    pass", wall_timeout_s=2, cpu_time_s=30)
    assert result.timed_out and not result.ok
    assert result.reason == "timed out after 2 s"
    assert time.monotonic() - started < 4


def test_sleeping_loop_is_killed_at_the_wall_timeout() -> None:
    result = run_python("import time\nwhile True:\n    time.sleep(1)", wall_timeout_s=1.5)
    assert result.timed_out and result.reason == "timed out after 1.5 s"


def test_cpu_limit_is_reported() -> None:
    result = run_python("while True:\n    pass", wall_timeout_s=10, cpu_time_s=1)
    assert not result.ok and not result.timed_out
    assert result.reason is not None and "CPU time limit" in result.reason


def test_fork_bomb_is_stopped_by_the_preamble() -> None:
    result = run_python("import os\nwhile True:\n    os.fork()", **FAST)
    assert not result.ok
    assert result.reason is not None and "creating processes is disabled" in result.reason
    if result.uid is not None:
        _assert_nothing_left(result.uid)
    _assert_parent_healthy()


def test_fork_bomb_bypassing_the_preamble_is_contained(isolation: tuple[str, ...]) -> None:
    if os.geteuid() == 0 and "uid" not in isolation:
        pytest.skip("as root without a fresh uid, RLIMIT_NPROC is not enforced")
    # libc fork() sidesteps the Python-level guard; exceptions are swallowed so the
    # bomb keeps trying until the wall clock ends it.
    bomb = (
        "import ctypes\nlibc = ctypes.CDLL(None)\n"
        "while True:\n    try:\n        libc.fork()\n    except Exception:\n        pass\n"
    )
    result = run_python(bomb, max_processes=32, **FAST)
    assert not result.ok and result.reason == "timed out after 3 s"
    if result.uid is not None:
        _assert_nothing_left(result.uid)
    _assert_parent_healthy()


def test_process_count_is_capped(isolation: tuple[str, ...]) -> None:
    if os.geteuid() == 0 and "uid" not in isolation:
        pytest.skip("as root without a fresh uid, RLIMIT_NPROC is not enforced")
    code = (
        "import os, time\nn = 0\n"
        "for _ in range(200):\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n"
        "    n += 1\nprint(n)\n"
    )
    result = run_python(code, max_processes=16, allow_subprocesses=True, **FAST)
    assert result.ok, result
    assert 0 < int(result.stdout) < 16
    # The sleeping children outlive the program: the sandbox must kill them.
    if result.uid is not None:
        _assert_nothing_left(result.uid)


def test_memory_bomb_hits_the_memory_limit() -> None:
    result = run_python(
        "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))", memory_mb=256, **FAST
    )
    assert not result.ok
    assert result.reason == "memory limit exceeded (256 MB)"
    _assert_parent_healthy()


def test_single_huge_allocation_fails() -> None:
    result = run_python("x = bytearray(8 * 1024**3)", memory_mb=256, **FAST)
    assert result.reason == "memory limit exceeded (256 MB)"


def test_huge_output_is_capped() -> None:
    started = time.monotonic()
    result = run_python("import sys\nsys.stdout.write('x' * 100_000_000)", **FAST)
    assert not result.ok and result.output_truncated
    assert result.reason == "output exceeded 65536 bytes"
    assert len(result.stdout.encode()) <= 65536
    assert time.monotonic() - started < 3


def test_huge_stderr_is_capped_too() -> None:
    result = run_python(
        "import sys\nwhile True:\n    sys.stderr.write('e' * 4096)", max_output_bytes=1000, **FAST
    )
    assert result.reason == "output exceeded 1000 bytes"
    assert len(result.stderr) <= 1000


def test_writing_outside_the_workdir_leaves_nothing(isolation: tuple[str, ...]) -> None:
    if "mountns" not in isolation:
        pytest.skip("needs a private mount namespace (root)")
    targets = [
        f"/tmp/pwned-{uuid.uuid4().hex}",
        str(PROJECT_ROOT / f"pwned-{uuid.uuid4().hex}"),
        "/var/tmp/pwned-sandbox-test",
    ]
    code = "import sys\nfor path in sys.stdin.read().split():\n    try:\n        open(path, 'w').write('x')\n    except OSError as exc:\n        print('refused', path, exc)\n"
    result = run_python(code, stdin="\n".join(targets), **FAST)
    assert result.ok, result
    assert f"refused {targets[1]}" in result.stdout  # the project directory is read-only
    for path in targets:
        assert not os.path.exists(path), path
    # The workdir itself is writable.
    assert (
        run_python("open('out.txt', 'w').write('ok'); print(open('out.txt').read())").stdout
        == "ok\n"
    )


def test_file_size_is_limited() -> None:
    code = "with open('big', 'wb') as fh:\n    fh.write(b'x' * (8 * 1024 * 1024))"
    result = run_python(code, disk_mb=1, **FAST)
    assert not result.ok
    # RLIMIT_FSIZE ("File too large") or the private tmpfs filling up, whichever bites first.
    assert result.reason is not None
    assert "File too large" in result.reason or "No space left" in result.reason


def test_project_files_and_home_are_hidden(isolation: tuple[str, ...]) -> None:
    if "mountns" not in isolation:
        pytest.skip("needs a private mount namespace (root)")
    # Masked as an empty folder, or absent altogether when the checkout lies under /tmp (the
    # child gets a private /tmp): either way none of its files can be read.
    code = (
        "import os\n"
        f"try:\n    print(os.listdir({str(PROJECT_ROOT)!r}))\n"
        "except (FileNotFoundError, PermissionError):\n    print('absent')\n"
    )
    result = run_python(code, **FAST)
    assert result.ok, result
    assert result.stdout.strip() in ("[]", "absent")


def test_environment_secrets_do_not_reach_the_child(
    monkeypatch: pytest.MonkeyPatch, isolation: tuple[str, ...]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    code = (
        "import os, sys\nprint(sorted(os.environ.items()))\n"
        "for pid in sys.stdin.read().split():\n"
        "    try:\n        print(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "    except OSError as exc:\n        print('refused', exc)\n"
    )
    # Reading our environ through /proc is only stoppable with a different uid or /proc.
    strong = "uid" in isolation or "mountns" in isolation
    result = run_python(code, stdin=str(os.getpid()) if strong else "", **FAST)
    assert result.ok, result
    assert "OPENAI_API_KEY" not in result.stdout
    assert "sk-test-secret" not in result.stdout + result.stderr


def _connection_arrived(listener: socket.socket) -> bool:
    readable, _, _ = select.select([listener], [], [], 0.3)
    return bool(readable)


def test_network_is_blocked_by_the_preamble() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"
        result = run_python(code, **FAST)
        assert not result.ok
        assert result.reason is not None and "network access is disabled" in result.reason
        assert not _connection_arrived(listener)


def test_network_is_unreachable_even_bypassing_the_preamble(isolation: tuple[str, ...]) -> None:
    if "netns" not in isolation:
        pytest.skip("needs a network namespace (root)")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = f"import _socket\ns = _socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', {port}))"
        result = run_python(code, **FAST)
        assert not result.ok
        assert result.reason is not None and "unreachable" in result.reason.lower()
        assert not _connection_arrived(listener)


def test_asyncio_still_works_inside_the_sandbox() -> None:
    # The socket guard keeps AF_UNIX, which asyncio's event loop needs for itself.
    result = run_python(
        "import asyncio\nasync def f():\n    return 5\nprint(asyncio.run(f()))", **FAST
    )
    assert result.ok and result.stdout.strip() == "5", result


# --------------------------------------------------------------------------------------
# Test styles
# --------------------------------------------------------------------------------------

ADD = "def add(a, b):\n    return a + b\n"
ADD_TEST = (
    "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"
)


def test_function_tests_pass_and_fail() -> None:
    assert run_function_tests(ADD, ADD_TEST, "add").all_passed
    bad = run_function_tests("def add(a, b):\n    return a - b\n", ADD_TEST, "add")
    assert bad.passed == 0 and bad.total == 1
    assert bad.first_failure is not None and "assert candidate(1, 2) == 3" in bad.first_failure


def test_function_tests_missing_entry_point() -> None:
    report = run_function_tests("def plus(a, b):\n    return a + b\n", ADD_TEST, "add")
    assert not report.all_passed
    assert "does not define 'add'" in (report.first_failure or "")


@pytest.mark.parametrize(
    "cheat",
    ["import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n", "raise SystemExit(0)\n"],
)
def test_exiting_early_does_not_pass(cheat: str) -> None:
    report = run_function_tests(
        ADD + cheat, ADD_TEST, "add", limits=SandboxLimits(wall_timeout_s=3)
    )
    assert not report.all_passed and report.fraction == 0.0


def test_unittest_style_counts_methods() -> None:
    test = (
        "import unittest\n"
        "class TestCases(unittest.TestCase):\n"
        "    def test_one(self):\n        self.assertEqual(add(1, 1), 2)\n"
        "    def test_two(self):\n        self.assertEqual(add(2, 2), 4)\n"
        "    def test_three(self):\n        self.assertEqual(add(2, 2), 5)\n"
    )
    report = run_function_tests(ADD, test)
    assert (report.passed, report.total) == (2, 3)
    assert report.first_failure is not None and report.first_failure.startswith("test_three")


def test_function_tests_timeout() -> None:
    report = run_function_tests(
        "def add(a, b):\n    while True:\n        pass\n",
        ADD_TEST,
        "add",
        limits=SandboxLimits(wall_timeout_s=1.5),
    )
    assert report.fraction == 0.0 and report.first_failure == "timed out after 1.5 s"


SUM_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)\n"


def test_stdio_tests_fraction_and_first_failure() -> None:
    cases = [
        {"input": "1 2\n", "output": "3\n"},
        {"input": "5 5\n", "output": "  10  \n\n"},  # whitespace differences are ignored
        {"input": "2 2\n", "output": "5\n"},
    ]
    report = run_stdio_tests(SUM_PROGRAM, cases)
    assert (report.passed, report.total) == (2, 3)
    assert report.fraction == pytest.approx(2 / 3)
    assert report.first_failure is not None and report.first_failure.startswith(
        "case 2: wrong output"
    )


def test_stdio_tests_report_crashes() -> None:
    report = run_stdio_tests(SUM_PROGRAM, [{"input": "", "output": "0"}])
    assert report.passed == 0
    assert "EOFError" in (report.first_failure or "")


@pytest.mark.parametrize(
    ("actual", "expected", "same"),
    [
        ("1 2\n3\n", "1  2\n3", True),
        ("\n\n1 2 \n", "1 2", True),
        ("1\t2", "1 2", True),
        ("1 2\n3", "1 2 3", False),
        ("12", "1 2", False),
    ],
)
def test_compare_stdout(actual: str, expected: str, same: bool) -> None:
    assert compare_stdout(actual, expected) is same


# --------------------------------------------------------------------------------------
# LeetCode-style ("functional") calls
# --------------------------------------------------------------------------------------

TWO_SUM = (
    "class Solution:\n"
    "    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
    "        seen = {}\n"
    "        for i, n in enumerate(nums):\n"
    "            if target - n in seen:\n"
    "                return (seen[target - n], i)  # a tuple counts as a list\n"
    "            seen[n] = i\n"
)
TWO_SUM_CASES = [
    {"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]"},
    {"input": "[3, 2, 4]\n6\n", "output": "[1, 2]"},
    {"input": "[3, 3]\n6", "output": "[0, 2]"},  # wrong on purpose: the answer is [0, 1]
]


def test_call_tests_call_the_solution_method_with_json_arguments() -> None:
    # List is used without an import, as LeetCode starter code does.
    report = run_call_tests(TWO_SUM, TWO_SUM_CASES, "twoSum", limits=SandboxLimits(**FAST))
    assert (report.passed, report.total) == (2, 3), report
    assert report.first_failure == "case 2: wrong answer: expected '[0, 2]', got '[0, 1]'"
    # a plain function works too when there is no Solution class
    plain = "def double(x):\n    return {'v': x * 2}\n"
    report = run_call_tests(plain, [{"input": "21", "output": '{"v": 42}'}], "double")
    assert report.all_passed, report


def test_call_tests_compare_json_values_outside_the_child() -> None:
    # An object that claims to equal anything is not a JSON value, so it cannot pass.
    cheat = (
        "class Anything:\n    def __eq__(self, other):\n        return True\n"
        "class Solution:\n    def f(self, x):\n        return Anything()\n"
    )
    report = run_call_tests(cheat, [{"input": "1", "output": "1"}], "f")
    assert report.passed == 0
    assert "not a JSON value" in (report.first_failure or "")
    # the child never sees the expected output: nothing it can read in its folder holds it
    peek = (
        "import os\nclass Solution:\n    def f(self, x):\n"
        "        return ''.join(open(n, errors='replace').read() for n in sorted(os.listdir('.')))\n"
    )
    report = run_call_tests(peek, [{"input": "1", "output": '"SENTINEL-expected"'}], "f")
    assert report.passed == 0
    got = (report.first_failure or "").split(", got ", 1)[1]
    assert "call_args" not in got  # (the preview is cut short; the check below is the point)
    assert "SENTINEL" not in got


def test_call_tests_report_missing_methods_crashes_and_bad_data() -> None:
    report = run_call_tests("class Solution:\n    pass\n", [{"input": "1", "output": "1"}], "f")
    assert report.passed == 0 and "Solution.f" in (report.first_failure or "")
    crash = "class Solution:\n    def f(self, x):\n        raise SystemExit(0)\n"
    report = run_call_tests(crash, [{"input": "1", "output": "1"}], "f")
    assert report.passed == 0 and "SystemExit" in (report.first_failure or "")
    report = run_call_tests(crash, [{"input": "not json", "output": "1"}], "f")
    assert report.passed == 0 and "bad test data" in (report.first_failure or "")
    assert parse_call_arguments('[1, 2]\n"a"\n\n') == [[1, 2], "a"]
    with pytest.raises(ValueError, match="line 2"):
        parse_call_arguments("1\n{")


def test_call_tests_still_enforce_the_time_limit() -> None:
    loop = "class Solution:\n    def f(self, x):\n        while True:\n            pass\n"
    report = run_call_tests(
        loop, [{"input": "1", "output": "1"}], "f", limits=SandboxLimits(**FAST)
    )
    assert report.passed == 0
    assert "timed out" in (report.first_failure or "") or "CPU" in (report.first_failure or "")


# --------------------------------------------------------------------------------------
# Site-packages (BigCodeBench)
# --------------------------------------------------------------------------------------


def test_site_packages_runs_keep_the_other_limits(isolation: tuple[str, ...]) -> None:
    numpy = pytest.importorskip("numpy")
    assert numpy is not None
    result = run_python("import numpy\nprint(numpy.arange(4).sum())", site_packages=True, **FAST)
    assert result.ok and result.stdout.strip() == "6", result
    blocked = run_python(
        "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
        site_packages=True,
        **FAST,
    )
    assert not blocked.ok and "network access is disabled" in (blocked.reason or "")
    if "mountns" in isolation:
        code = (
            "import os\n"
            f"try:\n    print(os.listdir({str(PROJECT_ROOT)!r}))\n"
            "except (FileNotFoundError, PermissionError):\n    print('absent')\n"
        )
        hidden = run_python(code, site_packages=True, **FAST)
        assert hidden.ok, hidden
        # the virtual environment may be re-exposed inside, but nothing else of the project
        assert hidden.stdout.strip() in ("[]", "['.venv']", "absent"), hidden.stdout


def test_site_packages_from_a_virtualenv_under_tmp(
    tmp_path: Path, isolation: tuple[str, ...]
) -> None:
    """The interpreter of a venv under /tmp (a CI clean clone) must survive the private /tmp."""
    if "mountns" not in isolation:
        pytest.skip("only a private mount namespace covers /tmp (root)")
    import sys

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "sandbox_probe.py").write_text("VALUE = 'from the venv'\n")
    src = PROJECT_ROOT / "src"
    driver = (
        # the sandbox modules alone: this bare venv has none of the project's dependencies,
        # so the package __init__ files (which import the verifiers) are skipped
        "import json, sys, types\n"
        "for name in ('conductor_pipeline', 'conductor_pipeline.tasks'):\n"
        "    package = sys.modules[name] = types.ModuleType(name)\n"
        f"    package.__path__ = [{str(src)!r} + '/' + name.replace('.', '/')]\n"
        "from conductor_pipeline.tasks import code_sandbox as module\n"
        "r = module.run_python('import sandbox_probe\\nprint(sandbox_probe.VALUE)',"
        " site_packages=True, wall_timeout_s=10)\n"
        "print(json.dumps({'ok': r.ok, 'reason': r.reason, 'stdout': r.stdout}))\n"
    )
    done = subprocess.run(
        [str(python), "-c", driver], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["ok"], outcome  # was: FileNotFoundError on .../venv/bin/python
    assert outcome["stdout"].strip() == "from the venv"
