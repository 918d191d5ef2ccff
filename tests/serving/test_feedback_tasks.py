"""From feedback over the real API (in process, fake pool, capture on) to the retraining
sources: one training task per asked question whatever context it came behind, and a
question that received different reference answers gives none, counted in the report."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from conductor_pipeline.pipelines.retraining.sources import collect_retraining_sources
from conductor_pipeline.serving.capture import CaptureSettings
from conductor_pipeline.serving.server import BackgroundServer
from conductor_pipeline.tasks import Task
from conductor_pipeline.tasks.sources.traffic import asked_question, question_key
from tests.serving.test_app import make_service, post
from tests.serving.test_feedback_api import send_feedback

PARAMS = {
    "watermarks": {"store": "file", "path": "data/watermarks.json"},
    "traffic": {"enabled": True, "path": "data/01_raw/traffic"},
}


def frame(*tasks: Task) -> pd.DataFrame:
    return pd.DataFrame([t.to_record() for t in tasks], columns=list(Task.__dataclass_fields__))


TRAIN = frame(Task("rg/1", "math", "easy", "What is 2 + 2?", "4", "number", "numeric", "rg"))
TEST = frame(Task("rg/2", "math", "easy", "What is 17 + 25?", "42", "number", "numeric", "rg"))


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_PROJECT_ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # project_root() is memoised per working directory
    return tmp_path


def in_context(question: str, variant: int) -> list[dict]:
    """The same question behind a different system message and earlier turns each time."""
    return [
        {"role": "system", "content": f"You are helper number {variant}."},
        {"role": "user", "content": f"Hello, this is attempt {variant}."},
        {"role": "assistant", "content": "Hello! Ask away."},
        {"role": "user", "content": question},
    ]


def ask_and_judge(root: Path, exchanges: list[tuple[list[dict], str]]) -> None:
    service = make_service(capture=CaptureSettings(enabled=True, path="data/01_raw/traffic"))
    service.root = root
    with BackgroundServer(service) as server:
        server.wait_ready()
        for messages, reference in exchanges:
            reply = post(server, {"model": "conductor", "messages": messages})
            assert reply.status_code == 200, reply.text
            body = {"request_id": reply.json()["id"], "reference_answer": reference}
            assert send_feedback(server.base_url, body).status_code == 200


def test_context_variants_with_different_references_give_no_task_and_are_counted(root):
    """Before, eight context variants of one question with eight different references all
    became training tasks."""
    question = "Compute 6 * 7."
    ask_and_judge(root, [(in_context(question, n), str(40 + n)) for n in range(8)])
    captured = [
        json.loads(line)["question"]
        for line in (root / "data/01_raw/traffic/requests.jsonl").read_text().splitlines()
    ]
    assert len(set(captured)) == 8 and {asked_question(q) for q in captured} == {question}
    joined, _, report = collect_retraining_sources(TRAIN, TEST, {"token": "t"}, PARAMS)
    assert list(joined["id"]) == ["rg/1"]
    [traffic] = report["sources"]
    assert traffic["conflicting_reference"] == 8 and traffic["conflicting_questions"] == 1
    assert traffic["train"] == 0


def test_context_variants_that_agree_give_one_task(root):
    question = "Compute 3 * 4."
    references = ["12", "12.0", " 12 "]
    ask_and_judge(root, [(in_context(question, n), ref) for n, ref in enumerate(references)])
    joined, _, report = collect_retraining_sources(TRAIN, TEST, {"token": "t"}, PARAMS)
    [task] = [row for row in joined.to_dict(orient="records") if row["source"] == "traffic"]
    assert question_key(task["question"]) == question_key(question) and task["answer"] == "12"
    [traffic] = report["sources"]
    assert traffic["repeated_question"] == 2 and traffic["conflicting_reference"] == 0


def test_a_test_question_behind_a_context_is_still_left_out(root):
    ask_and_judge(root, [(in_context("What is 17 + 25?", 1), "999")])
    joined, _, report = collect_retraining_sources(TRAIN, TEST, {"token": "t"}, PARAMS)
    assert list(joined["id"]) == ["rg/1"]
    assert report["sources"][0]["in_test_split"] == 1
