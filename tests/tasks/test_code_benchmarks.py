"""Code benchmarks judged end to end: loader fixture -> model-style response -> verify().

Regression tests for issue 13: BigCodeBench solutions that import numpy were marked wrong
(the sandbox ran without site-packages), and LiveCodeBench was judged on its public tests
only (compressed private tests skipped, LeetCode-style problems dropped).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor_pipeline.tasks.code_sandbox import run_call_tests, same_json_value
from conductor_pipeline.tasks.sources import load_livecodebench
from conductor_pipeline.tasks.sources.benchmarks import load_bigcodebench
from conductor_pipeline.tasks.verifiers import verify

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "benchmarks"


def _fenced(code: str) -> str:
    return f"Here is my solution.\n\n```python\n{code}```\n"


def _lcb(task_id: str):
    tasks = {t.id: t for t in load_livecodebench(data_files=FIXTURES / "livecodebench.jsonl")}
    return tasks[task_id]


def test_bigcodebench_numpy_solution_is_marked_correct() -> None:
    pytest.importorskip("numpy")
    task = next(
        t for t in load_bigcodebench(data_files=FIXTURES / "bigcodebench.jsonl") if "904" in t.id
    )
    # A full answer as a model writes it: its own imports and the whole function.
    right = (
        "import numpy as np\n\n"
        "def task_func(values):\n"
        "    data = np.array(values, dtype=np.float64)\n"
        "    return (data - np.mean(data)) / np.std(data)\n"
    )
    verdict = verify(task, _fenced(right))
    assert verdict.correct, verdict  # was: ModuleNotFoundError: No module named 'numpy'
    wrong = right.replace("np.std(data)", "np.std(data, ddof=1)")  # sample, not population
    verdict = verify(task, _fenced(wrong))
    assert not verdict.correct and "0/2 tests passed" in verdict.reason, verdict


def test_livecodebench_private_tests_decide_the_verdict() -> None:
    task = _lcb("livecodebench/1999B")
    right = (
        "n = int(input())\ns = input().strip()\n"
        "best = run = 1\n"
        "for a, b in zip(s, s[1:]):\n"
        "    run = run + 1 if a == b else 1\n"
        "    best = max(best, run)\n"
        "print(best)\n"
    )
    assert verify(task, _fenced(right)).correct
    # Passes the only public test (5 / aabbb -> 3) by counting the last run: the decoded
    # private tests (6 / abbbba -> 4) expose it.
    public_only = "n = int(input())\ns = input().strip()\nprint(len(s) - len(s.rstrip(s[-1])))\n"
    verdict = verify(task, _fenced(public_only))
    assert not verdict.correct, verdict
    assert "2/3 tests passed" in verdict.reason and "case 2" in verdict.reason


def test_livecodebench_functional_problem_is_judged() -> None:
    task = _lcb("livecodebench/3421")
    assert task.metadata["test_style"] == "functional"
    # As a model completes the starter code: List comes from the judge's predefined names.
    right = (
        "class Solution:\n"
        "    def maxPairSum(self, nums: List[int]) -> int:\n"
        "        a, b = sorted(nums)[-2:]\n"
        "        return a + b\n"
    )
    verdict = verify(task, _fenced(right))
    assert verdict.correct and "all 3 tests passed" in verdict.reason, verdict
    # Right on the public test, wrong on the private one with negative numbers.
    wrong = (
        "class Solution:\n"
        "    def maxPairSum(self, nums: List[int]) -> int:\n"
        "        return max(nums) + max(0, sorted(nums)[-2])\n"
    )
    verdict = verify(task, _fenced(wrong))
    assert not verdict.correct and verdict.score == pytest.approx(2 / 3), verdict
    assert "expected '-4', got '-1'" in verdict.reason


def test_livecodebench_call_mode_tells_booleans_from_numbers() -> None:
    # Python's True == 1 let a function returning True answer an expected 1 (issue 28);
    # a JSON judge tells true from 1. Numbers still compare by value: 2.0 answers 2.
    def returning(value: str) -> str:
        return f"class Solution:\n    def f(self, x):\n        return {value}\n"

    expect_one = [{"input": "0", "output": "1"}]
    verdict = run_call_tests(returning("True"), expect_one, "f")
    assert verdict.passed == 0, verdict
    assert verdict.first_failure == "case 0: wrong answer: expected '1', got 'true'"
    assert run_call_tests(returning("1"), expect_one, "f").all_passed
    assert run_call_tests(returning("1.0"), expect_one, "f").all_passed
    expect_true = [{"input": "0", "output": "true"}]
    assert run_call_tests(returning("1"), expect_true, "f").passed == 0
    assert run_call_tests(returning("True"), expect_true, "f").all_passed
    nested = [{"input": "0", "output": '{"a": [1, 0]}'}]
    assert run_call_tests(returning("{'a': [True, False]}"), nested, "f").passed == 0
    assert run_call_tests(returning("{'a': (1, 0)}"), nested, "f").all_passed


@pytest.mark.parametrize(
    ("actual", "expected", "same"),
    [
        (1, 1, True),
        (2.0, 2, True),
        (True, True, True),
        (True, 1, False),
        (0, False, False),
        ([1, [True]], [1, [1]], False),
        ({"k": False}, {"k": 0}, False),
        ({"k": [1, 2]}, {"k": [1, 2]}, True),
        ([1, 2], [1, 2, 3], False),
        ({"a": 1}, {"b": 1}, False),
        ([1], {"0": 1}, False),
        (None, None, True),
        (None, 0, False),
        ("1", 1, False),
    ],
)
def test_same_json_value(actual, expected, same) -> None:
    assert same_json_value(actual, expected) is same
    assert same_json_value(expected, actual) is same


def test_same_json_value_survives_deep_nesting() -> None:
    deep_left: list = []
    deep_right: list = []
    for _ in range(100_000):
        deep_left, deep_right = [deep_left], [deep_right]
    assert same_json_value(deep_left, deep_right)
