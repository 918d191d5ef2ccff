"""Captured requests + feedback -> training tasks and an evaluation slice: the join, the
test-split exclusion, provenance, the watermark and a deterministic order."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from conductor_pipeline.serving.capture import CaptureSettings, CaptureStore, capture_record
from conductor_pipeline.serving.feedback import FeedbackStore, parse_feedback
from conductor_pipeline.tasks import Task, verify
from conductor_pipeline.tasks.sources.traffic import (
    load_traffic,
    reference_verifier,
    slice_tasks,
    traffic_tasks,
)
from conductor_pipeline.tasks.splits import deduplicate

TEST_SPLIT = ["What is the capital of France?"]


def request(request_id: str, question: str, answer: str, time: str) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "time": time,
        "model": {"id": "conductor/3", "version": "3", "alias": "champion"},
        "question": question,
        "answer": answer,
        "steps": [],
    }


def feedback(request_id: str, time: str, **content: Any) -> dict[str, Any]:
    return {"request_id": request_id, "time": time, **content}


CAPTURED = [
    request("r1", "Compute 17 + 25.", "42", "2026-12-01T10:00:00.000000Z"),
    request(
        "r2",
        "Name the largest planet.",
        "It is this one.\nAnswer: Jupiter",
        "2026-12-01T10:01:00.000000Z",
    ),
    request("r3", "what is the capital of FRANCE", "Paris", "2026-12-01T10:02:00.000000Z"),
    request("r4", "Compute 6 * 7.", "41", "2026-12-01T10:03:00.000000Z"),
    request("r5", "Rate this haiku.", "7/10", "2026-12-01T10:04:00.000000Z"),
    request("r6", "compute 17 + 25", "42", "2026-12-01T10:05:00.000000Z"),
]
FEEDBACK = [
    feedback("r1", "2026-12-01T11:00:00.000000Z", reference_answer="42"),
    feedback("r2", "2026-12-01T11:01:00.000000Z", verdict="right"),
    feedback("r3", "2026-12-01T11:02:00.000000Z", reference_answer="Paris"),  # test split
    feedback("r4", "2026-12-01T11:03:00.000000Z", verdict="wrong"),
    feedback("r5", "2026-12-01T11:04:00.000000Z", score=0.5),
    feedback("r6", "2026-12-01T11:05:00.000000Z", reference_answer="42"),  # same question as r1
    feedback("r-gone", "2026-12-01T11:06:00.000000Z", verdict="right"),  # never captured
]


def test_references_become_training_tasks_with_their_provenance():
    result = traffic_tasks(CAPTURED, FEEDBACK, TEST_SPLIT)
    [task] = result.train
    assert task.id == "traffic/r1" and task.source == "traffic" and task.domain == "traffic"
    assert (task.question, task.answer) == ("Compute 17 + 25.", "42")
    assert (task.answer_format, task.verifier) == ("number", "numeric")
    assert task.metadata == {
        "request_id": "r1",
        "captured_at": "2026-12-01T10:00:00.000000Z",
        "feedback_at": "2026-12-01T11:00:00.000000Z",
        "model_version": "conductor/3",
        "served_answer": "42",
    }
    # the reward is verifiable: the project's verifier scores answers against it
    assert verify(task, "The answer is 42.").correct and not verify(task, "41").correct
    assert Task.from_record(task.to_record()) == task  # it fits the split tables


def test_verdicts_and_scores_make_the_evaluation_slice():
    rows = {
        row["request_id"]: row for row in traffic_tasks(CAPTURED, FEEDBACK, TEST_SPLIT).evaluation
    }
    assert sorted(rows) == ["r2", "r4", "r5"]
    right = Task.from_record(rows["r2"]["task"])
    assert right.answer == "Jupiter" and right.verifier == "exact"  # the stated final answer
    assert right.metadata["served_answer"].startswith("It is this one.")
    assert verify(right, "Answer: Jupiter").correct
    assert rows["r4"]["verdict"] == "wrong" and rows["r4"]["task"] is None
    assert rows["r4"]["served_answer"] == "41"
    assert rows["r5"]["score"] == 0.5 and rows["r5"]["task"] is None
    evaluation = traffic_tasks(CAPTURED, FEEDBACK, TEST_SPLIT).evaluation
    assert slice_tasks(evaluation) == [right]  # what a new version can be scored on


def test_test_split_questions_repeats_and_uncaptured_feedback_are_left_out():
    result = traffic_tasks(CAPTURED, FEEDBACK, TEST_SPLIT)
    every_id = [t.id for t in result.train] + [r["request_id"] for r in result.evaluation]
    assert "traffic/r3" not in every_id and "r3" not in every_id  # in the test split
    assert "traffic/r6" not in every_id  # same normalised question as r1
    summary = result.summary
    assert summary["in_test_split"] == 1 and summary["repeated_question"] == 1
    assert summary["not_captured"] == 1 and summary["train"] == 1 and summary["evaluation"] == 3
    # nothing that reaches training is a test question, even once data_prep deduplicates
    kept, _ = deduplicate(
        result.train + [Task("t1", "x", "easy", TEST_SPLIT[0], "Paris", "text", "exact", "s")]
    )
    assert len(kept) == len(result.train) + 1


def test_the_order_does_not_depend_on_the_input_order():
    first = traffic_tasks(CAPTURED, FEEDBACK, TEST_SPLIT)
    for seed in range(5):
        captured, given = list(CAPTURED), list(FEEDBACK)
        random.Random(seed).shuffle(captured)
        random.Random(seed + 100).shuffle(given)
        again = traffic_tasks(captured, given, TEST_SPLIT)
        assert again.train == first.train and again.evaluation == first.evaluation


def test_the_watermark_takes_only_newer_feedback():
    first = traffic_tasks(CAPTURED, FEEDBACK[:3], TEST_SPLIT)
    assert first.watermark == "2026-12-01T11:02:00.000000Z" and not first.unchanged
    second = traffic_tasks(CAPTURED, FEEDBACK, TEST_SPLIT, since=first.watermark)
    assert [r["request_id"] for r in second.evaluation] == ["r4", "r5"] and not second.train
    assert second.summary["older_than_watermark"] == 3
    # r6 repeats r1's question, taken by the earlier run: not taken again
    assert second.summary["repeated_question"] == 1
    third = traffic_tasks(CAPTURED, FEEDBACK, TEST_SPLIT, since=second.watermark)
    assert third.unchanged and third.watermark is None


def test_bad_records_are_counted_not_raised():
    result = traffic_tasks(
        [{"question": "no id"}, request("r1", "   ", "x", "t"), *CAPTURED[:1]],
        [
            {"time": "t"},
            feedback("r1", "2026-12-01T12:00:00Z", reference_answer="42", verifier="code"),
        ],
        [],
    )
    assert result.summary["invalid"] == 3 and not result.train
    assert "verifier" in result.summary["unusable_reference"][0]


@pytest.mark.parametrize(
    "answer, fmt, verifier, expected",
    [
        ("42", None, None, ("number", "numeric")),
        ("-3.5", None, None, ("number", "numeric")),
        ("Paris", None, None, ("text", "exact")),
        ("x^2", "math", None, ("math", "math")),
        ("C", "letter", None, ("letter", "multiple_choice")),
        ("7", "text", "exact", ("text", "exact")),
    ],
)
def test_reference_verifier_defaults(answer, fmt, verifier, expected):
    assert reference_verifier(answer, fmt, verifier) == expected


def test_load_traffic_reads_what_the_server_writes(tmp_path: Path):
    capture = CaptureStore(CaptureSettings(enabled=True, path="capture"), tmp_path)
    store = FeedbackStore(capture)
    for request_id, question in [("a", "Compute 2 + 2."), ("b", "Spell cat backwards.")]:
        record = {"request_id": request_id, "model": {"id": "conductor/base"}, "steps": []}
        capture.append(capture_record(question, "4" if request_id == "a" else "tac", record))
    store.submit(parse_feedback({"request_id": "a", "reference_answer": "4"}))
    store.submit(parse_feedback({"request_id": "b", "verdict": "right"}))
    result = load_traffic(tmp_path / "capture", TEST_SPLIT)
    assert [t.id for t in result.train] == ["traffic/a"]
    assert [r["request_id"] for r in result.evaluation] == ["b"]
    assert result.summary["unreadable_lines"] == 0
    assert load_traffic(tmp_path / "capture", [], since=result.watermark).unchanged
    assert load_traffic(tmp_path / "missing", []).unchanged
