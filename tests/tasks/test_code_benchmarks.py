"""Code benchmarks judged end to end: loader fixture -> model-style response -> verify().

Regression tests for issue 13: BigCodeBench solutions that import numpy were marked wrong
(the sandbox ran without site-packages), and LiveCodeBench was judged on its public tests
only (compressed private tests skipped, LeetCode-style problems dropped).
"""

from __future__ import annotations

from pathlib import Path

import pytest

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
