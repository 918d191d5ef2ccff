from collections import Counter

import pytest

from conductor_pipeline.tasks.splits import (
    balance_domains,
    deduplicate,
    normalise_question,
    split_tasks,
)
from conductor_pipeline.tasks.types import Task


def make_task(
    i: int, domain: str = "math", difficulty: str = "easy", question: str | None = None
) -> Task:
    return Task(
        id=f"t{i:04d}",
        domain=domain,
        difficulty=difficulty,
        question=question or f"What is {i} plus {i}?",
        answer=str(2 * i),
        answer_format="number",
        verifier="numeric",
        source="unit",
    )


def test_normalise_question_ignores_case_punctuation_accents_and_spacing():
    assert normalise_question("  What is  2+2? ") == normalise_question("what is 2 + 2")
    assert normalise_question("Café") == normalise_question("cafe")
    assert normalise_question("a b") != normalise_question("ab")


def test_deduplicate_keeps_first_and_reports_the_dropped_pair():
    tasks = [make_task(1), make_task(2, question="WHAT is 1 plus 1"), make_task(3)]
    kept, dropped = deduplicate(tasks)
    assert [t.id for t in kept] == ["t0001", "t0003"]
    assert dropped == [("t0002", "t0001")]


def test_deduplicate_rejects_repeated_ids():
    with pytest.raises(ValueError, match="duplicate task id 't0001'"):
        deduplicate([make_task(1), make_task(1, question="something else")])


def test_split_is_deterministic_disjoint_and_stratified():
    tasks = [
        make_task(i, domain=("math", "logic")[i % 2], difficulty=("easy", "hard")[i % 3 == 0])
        for i in range(200)
    ]
    ratios = {"train": 0.6, "validation": 0.15, "test": 0.25}
    first = split_tasks(tasks, ratios, seed=7)
    assert first == split_tasks(tasks, ratios, seed=7)
    assert first != split_tasks(tasks, ratios, seed=8)
    ids = [t.id for part in first.values() for t in part]
    assert len(ids) == len(set(ids)) == 200
    assert [len(first[name]) for name in ("train", "validation", "test")] == [120, 30, 50]
    test_domains = Counter(t.domain for t in first["test"])
    assert test_domains["math"] == test_domains["logic"] == 25


def test_balance_respects_quota_and_difficulty_mix():
    tasks = [
        make_task(i, domain="math", difficulty="easy" if i < 75 else "hard") for i in range(100)
    ]
    tasks += [make_task(100 + i, domain="code") for i in range(10)]
    kept, report = balance_domains(tasks, {"math": 40, "code": 50}, seed=1)
    by_domain = Counter(t.domain for t in kept)
    assert by_domain == {"math": 40, "code": 10}
    assert Counter(t.difficulty for t in kept if t.domain == "math") == {"easy": 30, "hard": 10}
    assert report == {"code": {"available": 10, "kept": 10}, "math": {"available": 100, "kept": 40}}
