"""Learning from traffic: the retraining nodes of the growing sources (captured requests with
feedback join the training split, verdicts form the new slice, watermarks move only at the
commit), the promotion gate on the new slice, and (slow) the whole loop on the sandbox:
``conductor serve`` with capture on, feedback over HTTP, the retraining pipeline run twice."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from conductor_pipeline import promotion
from conductor_pipeline.pipelines.retraining.sources import (
    collect_retraining_sources,
    commit_source_watermarks,
    evaluate_traffic_slice,
)
from conductor_pipeline.promotion import Decision, Figures, Gates
from conductor_pipeline.serving.capture import CaptureSettings, capture_record
from conductor_pipeline.serving.feedback import open_stores, parse_feedback
from conductor_pipeline.tasks import Task
from tests.pipelines.test_promotion_pipeline import promote, summary, tags

REPO = Path(__file__).resolve().parents[2]
TEST_QUESTION = "What is 17 + 25?"


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_PROJECT_ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # project_root() is memoised per working directory
    return tmp_path


def frame(*tasks: Task) -> pd.DataFrame:
    return pd.DataFrame([t.to_record() for t in tasks], columns=list(Task.__dataclass_fields__))


TRAIN = frame(Task("rg/1", "math", "easy", "What is 2 + 2?", "4", "number", "numeric", "rg"))
TEST = frame(Task("rg/2", "math", "easy", TEST_QUESTION, "42", "number", "numeric", "rg"))
PARAMS = {
    "watermarks": {"store": "file", "path": "data/watermarks.json"},
    "traffic": {"enabled": True, "path": "data/01_raw/traffic"},
}


def serve_and_judge(root: Path, exchanges: list[tuple[str, str, dict]]) -> None:
    """Write what a server with capture on writes: each (question, answer) captured, then the
    feedback body (without its id) posted on it."""
    capture, feedback = open_stores(CaptureSettings(enabled=True), root)
    for number, (question, answer, body) in enumerate(exchanges):
        request_id = f"chatcmpl-{len(capture.records()) + number:04d}"
        record = {"request_id": request_id, "model": {"id": "conductor/3"}, "steps": []}
        capture.append(capture_record(question, answer, record))
        status, _ = feedback.submit(parse_feedback({"request_id": request_id, **body}))
        assert status == 200


def test_traffic_joins_training_the_slice_is_kept_apart_and_a_rerun_is_unchanged(root):
    serve_and_judge(
        root,
        [
            ("Compute 6 * 7.", "It is 42.", {"reference_answer": "42"}),
            (TEST_QUESTION, "42", {"reference_answer": "42"}),  # the anchor: left out
            ("What is 2 + 2?", "4", {"reference_answer": "4"}),  # already in training
            ("Name a prime above 10.", "Answer: 11", {"verdict": "right"}),
            ("Spell cat backwards.", "tac", {"verdict": "wrong"}),
        ],
    )
    joined, new_slice, report = collect_retraining_sources(TRAIN, TEST, {"token": "t"}, PARAMS)
    questions = list(joined["question"])
    assert questions == ["What is 2 + 2?", "Compute 6 * 7."]
    assert joined.iloc[1]["id"].startswith("traffic/") and joined.iloc[1]["answer"] == "42"
    assert list(new_slice["question"]) == ["Name a prime above 10."]
    assert new_slice.iloc[0]["answer"] == "11"
    assert report["unchanged"] is False and report["added_to_training"] == 1
    assert report["evaluation_slice"] == {
        "tasks": 1, "right": 1, "wrong": 1, "scores": 0, "mean_score": None
    }  # fmt: skip
    [traffic] = report["sources"]
    assert traffic["in_test_split"] == 1 and len(report["already_in_training"]) == 1
    assert "Compute 6 * 7." not in json.dumps(report)  # counts, ids and watermarks only

    # nothing moves before the commit: a failed run reads the same again
    assert not (root / "data" / "watermarks.json").exists()
    again, _, _ = collect_retraining_sources(TRAIN, TEST, {"token": "t"}, PARAMS)
    assert len(again) == 2

    done = commit_source_watermarks(report, {"decision": "promoted"}, "<html>", "<html>", PARAMS)
    assert done == {
        "moved": ["traffic"],
        "unchanged": False,
        "decision": "promoted",
        "reports_rendered": True,
    }
    stored = json.loads((root / "data" / "watermarks.json").read_text())
    assert stored["traffic"] == traffic["watermark"]

    rerun, rerun_slice, rerun_report = collect_retraining_sources(
        TRAIN, TEST, {"token": "u"}, PARAMS
    )
    assert rerun.equals(TRAIN) and rerun_slice.empty and rerun_report["unchanged"] is True
    moved = commit_source_watermarks(rerun_report, {}, "<html>", "<html>", PARAMS)
    assert moved["moved"] == [] and moved["unchanged"] is True


def test_bad_source_settings_name_the_key(root):
    with pytest.raises(ValueError, match=r"retraining_sources.traffic: unknown key"):
        collect_retraining_sources(TRAIN, TEST, {}, {"traffic": {"enabeld": True}})


def test_an_empty_slice_is_evaluated_by_nobody():
    results, figures = evaluate_traffic_slice(
        frame(), TRAIN, frame(), {}, {}, {}, {}, {}, {"model_uri": "models:/conductor/2"}
    )
    assert (
        results.empty
        and figures["questions"] == 0
        and "no new evaluation slice" in (figures["skipped"])
    )


# ------------------------------------------------------------------------------ the gate


def decision(**gates: float) -> Decision:
    figures = Figures(accuracy=0.5, cost_usd_per_q=0.002, parse_rate=1.0, n=12)
    return promotion.decide(figures, figures, Gates(**gates))


def on_slice(challenger: float, champion: float) -> dict:
    return {
        "questions": 10,
        "skipped": None,
        "challenger": {"accuracy": challenger, "n": 10},
        "champion": {"accuracy": champion, "n": 10},
    }


@pytest.mark.parametrize(
    ("challenger", "champion", "tolerance", "passes"),
    [(0.8, 0.7, 0.0, True), (0.7, 0.7, 0.0, True), (0.6, 0.7, 0.0, False), (0.6, 0.7, 0.1, True)],
)
def test_the_new_slice_asks_for_improvement_or_parity(challenger, champion, tolerance, passes):
    made = decision(max_slice_accuracy_drop=tolerance)
    assert made.promote
    assert promotion.gate_new_slice(made, on_slice(challenger, champion)) is None
    assert made.checks["new_slice"] is passes and made.promote is passes
    assert "new slice (10 served questions)" in made.reasons[-1]


def test_the_slice_gate_is_skipped_with_its_reason():
    made = decision()
    reason = promotion.gate_new_slice(made, {"questions": 0, "skipped": "no new slice"})
    assert reason == "no new slice" and made.promote and "new_slice" not in made.checks
    assert made.reasons[-1] == "new-slice gate skipped: no new slice"
    half = decision()
    assert "both versions" in promotion.gate_new_slice(half, {"challenger": {"accuracy": 1}})
    assert half.promote


def test_promotion_refuses_a_version_that_regresses_on_the_new_slice(registry):
    first, second, third = registry
    promote(first, summary(0.5))
    params = {"gates": {"max_accuracy_drop": 0.05, "max_slice_accuracy_drop": 0.0}}
    from conductor_pipeline.pipelines.promotion.nodes import promote_challenger
    from tests.pipelines.test_promotion_pipeline import results, run_info

    refused = promote_challenger(
        summary(0.6), run_info(second), results(), params, on_slice(0.5, 0.8)
    )
    assert refused["decision"] == "refused" and refused["new_slice"]["champion"]["accuracy"] == 0.8
    assert (
        "new slice (10 served questions): accuracy 0.500 vs champion 0.800"
        in (tags(second)["promotion.reason"])
    )
    skipped = promote_challenger(
        summary(0.6), run_info(third), results(), params, {"questions": 0, "skipped": "none new"}
    )
    assert skipped["decision"] == "promoted"
    assert "new-slice gate skipped: none new" in skipped["reasons"]
