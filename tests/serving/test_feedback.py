"""``POST /v1/feedback`` bodies and their store: validation that names the field, unknown
request ids, idempotency, conflicts, capture off, several writers, retention."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from conductor_pipeline.serving.capture import (
    CaptureSettings,
    CaptureStore,
    FeedbackSettings,
    capture_record,
)
from conductor_pipeline.serving.errors import ApiError
from conductor_pipeline.serving.feedback import FeedbackStore, open_stores, parse_feedback
from conductor_pipeline.tasks.sources.traffic import read_records

DAY = 86400.0


def captured(tmp_path: Path, *ids: str, **settings: Any) -> CaptureStore:
    store = CaptureStore(CaptureSettings(enabled=True, path="capture", **settings), tmp_path)
    for request_id in ids:
        record = {"request_id": request_id, "model": {"id": "conductor/3"}, "steps": []}
        store.append(capture_record(f"question of {request_id}", "42", record))
    return store


# ------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            {"request_id": "r1", "reference_answer": "42"},
            {"reference_answer": "42", "answer_format": "number", "verifier": "numeric"},
        ),
        (
            {"request_id": "r1", "reference_answer": "Paris"},
            {"answer_format": "text", "verifier": "exact"},
        ),
        (
            {"request_id": "r1", "reference_answer": "\\frac{1}{2}", "answer_format": "math"},
            {"answer_format": "math", "verifier": "math"},
        ),
        (
            {"request_id": "r1", "reference_answer": "B", "verifier": "multiple_choice"},
            {"answer_format": "text", "verifier": "multiple_choice"},
        ),
        ({"request_id": "r1", "verdict": "right"}, {"verdict": "right", "score": None}),
        ({"request_id": "r1", "score": 0}, {"score": 0.0}),
        ({"request_id": "r1", "score": 0.75, "comment": "close"}, {"score": 0.75}),
    ],
)
def test_valid_bodies(body, expected):
    content = parse_feedback(body).content()
    assert {k: content[k] for k in expected} == expected


@pytest.mark.parametrize(
    "body, param, phrase",
    [
        ({"reference_answer": "42"}, "request_id", "Field required"),
        ({"request_id": "", "verdict": "right"}, "request_id", "at least 1"),
        ({"request_id": 7, "verdict": "right"}, "request_id", "string"),
        ({"request_id": "r1"}, None, "exactly one of reference_answer, verdict, score"),
        ({"request_id": "r1", "verdict": "right", "score": 1}, None, "(got verdict, score)"),
        ({"request_id": "r1", "verdict": "maybe"}, "verdict", "'right' or 'wrong'"),
        ({"request_id": "r1", "score": 1.5}, "score", "less than or equal to 1"),
        ({"request_id": "r1", "score": -0.1}, "score", "greater than or equal to 0"),
        ({"request_id": "r1", "score": "0.5"}, "score", "number"),
        ({"request_id": "r1", "score": True}, "score", "not a boolean"),
        ({"request_id": "r1", "score": float("nan")}, "score", "finite"),
        ({"request_id": "r1", "score": float("inf")}, "score", "finite"),
        ({"request_id": "r1", "reference_answer": "  "}, "reference_answer", "blank"),
        ({"request_id": "r1", "reference_answer": "x", "verifier": "code"}, "verifier", "'math'"),
        (
            {"request_id": "r1", "reference_answer": "x", "answer_format": "code"},
            "answer_format",
            "'number'",
        ),
        ({"request_id": "r1", "verdict": "right", "verifier": "exact"}, "verifier", "only"),
        (
            {"request_id": "r1", "verdict": "right", "answer": "42"},
            "answer",
            "feedback: unknown key 'answer' (did you mean 'answer_format'?); known keys: "
            "answer_format, comment, reference_answer, request_id, score, verdict, verifier",
        ),
    ],
)
def test_bad_bodies_are_a_400_naming_the_field(body, param, phrase):
    with pytest.raises(ApiError) as err:
        parse_feedback(body)
    assert err.value.status == 400 and err.value.param == param
    assert phrase in err.value.message, err.value.message
    assert err.value.body()["error"]["code"] == "invalid_feedback"


def test_a_body_that_is_not_an_object_is_a_400():
    with pytest.raises(ApiError) as err:
        parse_feedback(["request_id", "r1"])
    assert err.value.status == 400 and "JSON object" in err.value.message


# ------------------------------------------------------------------------------ the store


def test_feedback_for_an_unknown_request_is_a_404_and_is_not_stored(tmp_path):
    feedback = FeedbackStore(captured(tmp_path, "r1"))
    with pytest.raises(ApiError) as err:
        feedback.submit(parse_feedback({"request_id": "r-unknown", "verdict": "right"}))
    assert err.value.status == 404 and err.value.param == "request_id"
    assert err.value.code == "unknown_request_id"
    assert feedback.records() == []


def test_the_same_body_twice_is_idempotent_and_a_different_one_a_409(tmp_path):
    feedback = FeedbackStore(captured(tmp_path, "r1"))
    body = {"request_id": "r1", "reference_answer": "42"}
    status, first = feedback.submit(parse_feedback(body))
    assert status == 200 and first["kind"] == "reference_answer" and first["joinable"]
    assert first["duplicate"] is False
    # the implied verifier is filled in, so naming it explicitly is the same body
    status, again = feedback.submit(parse_feedback({**body, "verifier": "numeric"}))
    assert status == 200 and again["duplicate"] is True
    assert again["received"] == first["received"]
    with pytest.raises(ApiError) as err:
        feedback.submit(parse_feedback({"request_id": "r1", "verdict": "wrong"}))
    assert err.value.status == 409 and err.value.code == "feedback_conflict"
    [record] = feedback.records()
    assert record["reference_answer"] == "42" and record["verifier"] == "numeric"


def test_with_capture_off_feedback_is_refused_and_nothing_is_written(tmp_path):
    """Before, any id was kept ``"joinable": false``: disk anyone could fill."""
    off = CaptureStore(CaptureSettings(path="capture"), tmp_path)
    feedback = FeedbackStore(off)
    with pytest.raises(ApiError) as err:
        feedback.submit(parse_feedback({"request_id": "anything", "score": 1}))
    assert err.value.status == 404 and err.value.code == "capture_off"
    assert "serving.capture.enabled" in str(err.value)
    assert not (tmp_path / "capture").exists() and feedback.records() == []


def test_two_stores_on_one_folder_see_each_others_feedback(tmp_path):
    """Two server processes: each reads what the other appended before judging."""
    capture = captured(tmp_path, "r1", "r2")
    one, two = FeedbackStore(capture), FeedbackStore(capture)
    one.submit(parse_feedback({"request_id": "r1", "verdict": "right"}))
    assert two.submit(parse_feedback({"request_id": "r1", "verdict": "right"}))[1]["duplicate"]
    with pytest.raises(ApiError, match="already has different feedback"):
        two.submit(parse_feedback({"request_id": "r1", "verdict": "wrong"}))
    two.submit(parse_feedback({"request_id": "r2", "score": 0.5}))
    with pytest.raises(ApiError) as err:
        one.submit(parse_feedback({"request_id": "r2", "score": 0.25}))
    assert err.value.status == 409
    assert [r["request_id"] for r in one.records()] == ["r1", "r2"]


def test_concurrent_submissions_for_one_request_store_one_line(tmp_path):
    feedback = FeedbackStore(captured(tmp_path, "r1"))
    outcomes: list[Any] = []

    def send(verdict: str) -> None:
        try:
            outcomes.append(
                feedback.submit(parse_feedback({"request_id": "r1", "verdict": verdict}))[0]
            )
        except ApiError as err:
            outcomes.append(err.status)

    threads = [threading.Thread(target=send, args=(v,)) for v in ["right", "wrong"] * 8]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records, unreadable = read_records(tmp_path / "capture", "feedback")
    assert len(records) == 1 and unreadable == 0
    winner = records[0]["verdict"]
    assert outcomes.count(200) == 8 and outcomes.count(409) == 8, (winner, outcomes)


def test_capture_retention_applies_to_feedback_at_start_up(tmp_path):
    now = 1_800_000_000.0
    capture = captured(tmp_path, "old", "new", max_age_days=None)
    FeedbackStore(capture, clock=lambda: now - 40 * DAY).submit(
        parse_feedback({"request_id": "old", "verdict": "right"})
    )
    FeedbackStore(capture, clock=lambda: now - DAY).submit(
        parse_feedback({"request_id": "new", "verdict": "wrong"})
    )
    kept = FeedbackStore(
        CaptureStore(
            CaptureSettings(enabled=True, path="capture", max_age_days=30),
            tmp_path,
            clock=lambda: now,
        ),
        clock=lambda: now,
    )
    assert [r["request_id"] for r in kept.records()] == ["new"]


def test_a_secret_quoted_in_feedback_is_masked_and_a_retry_is_still_the_same(tmp_path):
    secret = "sk-feedback-secret-0a1b2c3d"
    capture = CaptureStore(
        CaptureSettings(enabled=True, path="capture"), tmp_path, secrets=[secret]
    )
    capture.append(capture_record("q", "a", {"request_id": "r1", "steps": []}))
    feedback = FeedbackStore(capture)
    body = {"request_id": "r1", "verdict": "wrong", "comment": f"it printed {secret}"}
    feedback.submit(parse_feedback(body))
    assert feedback.submit(parse_feedback(body))[1]["duplicate"]
    text = (tmp_path / "capture" / "feedback.jsonl").read_text()
    assert secret not in text and "it printed ***" in text


def test_open_stores_puts_feedback_next_to_the_capture(tmp_path):
    capture, feedback = open_stores(
        CaptureSettings(enabled=True, path="traffic"), tmp_path, secrets=["sk-0123456789"]
    )
    assert feedback.path == tmp_path / "traffic" / "feedback.jsonl" and capture.enabled
    assert capture.secrets == ["sk-0123456789"]


# ------------------------------------------------------------------------------ bounds


def _comment_body(request_id: str) -> dict[str, Any]:
    return {"request_id": request_id, "verdict": "wrong", "comment": "x" * 1500}


def test_feedback_rotates_past_its_size_and_keeps_a_bounded_count(tmp_path):
    """Before, ``feedback.jsonl`` grew without bound and every record stayed in memory."""
    ids = [f"r{n:03d}" for n in range(40)]
    limits = FeedbackSettings(max_file_bytes=8192, keep_files=2, max_records=12)
    feedback = FeedbackStore(captured(tmp_path, *ids, feedback=limits))
    for request_id in ids:
        feedback.submit(parse_feedback(_comment_body(request_id)))
    folder = tmp_path / "capture"
    files = sorted(p.name for p in folder.glob("feedback*.jsonl"))
    assert files == ["feedback.1.jsonl", "feedback.2.jsonl", "feedback.jsonl"]
    assert all(p.stat().st_size <= 8192 for p in folder.glob("feedback*.jsonl"))
    kept = [r["request_id"] for r in feedback.records()]
    assert kept == ids[-len(kept) :] and len(kept) <= 12 + 8192 // 1500
    assert len(feedback) == len(kept)  # the index holds what the files hold, no more
    # the newest feedback is still idempotent and still refuses a different body
    assert feedback.submit(parse_feedback(_comment_body(ids[-1])))[1]["duplicate"]
    with pytest.raises(ApiError, match="already has different feedback"):
        feedback.submit(parse_feedback({"request_id": ids[-1], "verdict": "right"}))


def test_a_store_started_later_applies_the_count_cap(tmp_path):
    ids = [f"r{n}" for n in range(10)]
    feedback = FeedbackStore(captured(tmp_path, *ids))
    for request_id in ids:
        feedback.submit(parse_feedback({"request_id": request_id, "verdict": "right"}))
    capped = CaptureStore(
        CaptureSettings(enabled=True, path="capture", feedback=FeedbackSettings(max_records=3)),
        tmp_path,
    )
    later = FeedbackStore(capped)
    assert [r["request_id"] for r in later.records()] == ids[-3:] and len(later) == 3


def test_a_second_store_follows_a_rotation_made_by_the_first(tmp_path):
    ids = [f"r{n}" for n in range(12)]
    limits = FeedbackSettings(max_file_bytes=4096, keep_files=10, max_records=100)
    capture = captured(tmp_path, *ids, feedback=limits)
    one, two = FeedbackStore(capture), FeedbackStore(capture)
    one.submit(parse_feedback(_comment_body("r0")))
    assert two.submit(parse_feedback(_comment_body("r0")))[1]["duplicate"]
    for request_id in ids[1:]:
        one.submit(parse_feedback(_comment_body(request_id)))
    assert (tmp_path / "capture" / "feedback.1.jsonl").exists()
    with pytest.raises(ApiError) as err:
        two.submit(parse_feedback({"request_id": "r0", "verdict": "right"}))
    assert err.value.status == 409


@pytest.mark.parametrize(
    "feedback, phrase",
    [
        ({"max_file_bytes": 10}, "feedback.max_file_bytes"),
        ({"max_records": None}, "feedback.max_records"),
        ({"keep": 1}, "serving.capture.feedback: unknown key 'keep'"),
        ("big", "must be a mapping"),
    ],
)
def test_bad_feedback_bounds_name_the_key(feedback, phrase):
    with pytest.raises(ValueError, match=phrase):
        CaptureSettings.from_mapping({"feedback": feedback})


def test_a_reference_answer_that_is_a_credential_is_refused(tmp_path):
    feedback = FeedbackStore(captured(tmp_path, "r1"))
    body = {"request_id": "r1", "reference_answer": "ghp_0123456789abcdefghijABCDEFGHIJ"}
    with pytest.raises(ApiError) as err:
        feedback.submit(parse_feedback(body))
    assert err.value.status == 400 and err.value.param == "reference_answer"
    assert feedback.records() == []
