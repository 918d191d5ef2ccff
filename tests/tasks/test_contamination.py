"""Evaluation questions in disguise stay out of training (issue 28, item 2): the normaliser,
the near-duplicate index, and the traffic, drop-folder and growing sources that use them;
distinct procedural questions stay distinct."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest

from conductor_pipeline.pipelines.retraining.pipeline import create_pipeline
from conductor_pipeline.pipelines.retraining.sources import collect_retraining_sources
from conductor_pipeline.serving.schema import compose_question
from conductor_pipeline.tasks import Task
from conductor_pipeline.tasks.contamination import EvaluationIndex, char_ngrams, containment
from conductor_pipeline.tasks.sources.dropfolder import FileWatermarks
from conductor_pipeline.tasks.sources.growing import collect_sources, sources_settings
from conductor_pipeline.tasks.sources.traffic import traffic_tasks
from conductor_pipeline.tasks.splits import deduplicate, normalise_question
from conductor_pipeline.workers.chat_request import Message

TEST_QUESTION = "Calculate -5 + -5."
VALIDATION_QUESTION = "Spell this word backward (example: sun -> nus): wig"


def _behind_system_message() -> str:
    messages = [
        Message(role="system", content="You are a careful calculator."),
        Message(role="user", content=TEST_QUESTION),
    ]
    return compose_question(messages, 1000, 1000)[0]


def _behind_earlier_turns() -> str:
    messages = [
        Message(role="user", content="Hello."),
        Message(role="assistant", content="Hi, what shall I compute?"),
        Message(role="user", content=TEST_QUESTION),
    ]
    return compose_question(messages, 1000, 1000)[0]


# the disguises of the issue, and a near duplicate with a small edit
DISGUISES = {
    "system message": _behind_system_message(),
    "earlier turns": _behind_earlier_turns(),
    "zero-width space": "Calcu\u200blate -5 + -5.",
    "Cyrillic a": "C\u0430lculate -5 + -5.",
    "Unicode minus, fullwidth plus": "Calculate \u22125 \uff0b \u22125",
    "quoted in a longer message": "Please, calculate -5 + -5. Thanks a lot!",
    "validation question, Greek omicron": "Spell this w\u03bfrd backward (example: sun -> nus): wig",
}
# distinct questions that look alike: none may be taken for an evaluation question
DISTINCT = [
    "Calculate -6 + -5.",
    "Calculate -5 - -5.",
    "Calculate -(-5 + -5).",
    "Spell this word backward (example: sun -> nus): wir",
]
SPLITS = {"test": [TEST_QUESTION], "validation": [VALIDATION_QUESTION]}


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (TEST_QUESTION, "Calcu\u200blate -5 + -5."),
        (TEST_QUESTION, "C\u0430lculate -5 + -5."),
        (TEST_QUESTION, "CALCULATE \u22125 + \u22125"),
        ("1 + -5", "1+-5"),
        ("2 \u00d7 3 \u00f7 4", "2*3/4"),
    ],
)
def test_normalise_question_sees_through_disguises(first, second):
    assert normalise_question(first) == normalise_question(second)


@pytest.mark.parametrize(
    ("first", "second"),
    [("1 + -5", "-(-1 + -5)"), (TEST_QUESTION, "Calculate -6 + -5."), ("a < b", "a > b")],
)
def test_normalise_question_keeps_operators_and_brackets(first, second):
    assert normalise_question(first) != normalise_question(second)


def test_dedup_keeps_questions_that_differ_in_operators():
    tasks = [
        Task(
            id=f"t{i}",
            domain="math",
            difficulty="easy",
            question=q,
            answer="0",
            answer_format="number",
            verifier="numeric",
            source="test",
        )
        for i, q in enumerate(["Calculate 1 + -5.", "Calculate -( -1 + -5 ).", "Calculate 1+-5"])
    ]
    kept, dropped = deduplicate(tasks)
    assert [t.id for t in kept] == ["t0", "t1"] and dropped == [("t2", "t0")]


@pytest.mark.parametrize("name", sorted(DISGUISES))
def test_the_index_finds_every_disguise(name):
    found = EvaluationIndex(SPLITS).match(DISGUISES[name].split("now:\n")[-1])
    assert found is not None
    expected = "validation" if "validation" in name else "test"
    assert found.split == expected


@pytest.mark.parametrize("question", DISTINCT)
def test_the_index_keeps_distinct_questions_apart(question):
    assert EvaluationIndex(SPLITS).match(question) is None


def test_threshold_one_keeps_only_equal_questions_out():
    index = EvaluationIndex(SPLITS, threshold=1)
    assert "Calcu\u200blate -5 + -5." in index
    assert "Please, calculate -5 + -5. Thanks a lot!" not in index


def _captured(request_id: str, question: str) -> dict[str, str]:
    return {"request_id": request_id, "time": "2026-12-01T10:00:00Z", "question": question}


def test_traffic_with_a_disguised_evaluation_question_gives_no_training_task():
    questions = list(DISGUISES.values()) + DISTINCT
    captured = [_captured(f"r{i}", q) for i, q in enumerate(questions)]
    feedback = [
        {"request_id": f"r{i}", "time": f"2026-12-01T11:00:{i:02d}Z", "reference_answer": "999"}
        for i in range(len(questions))
    ]
    result = traffic_tasks(captured, feedback, SPLITS)
    assert sorted(t.question for t in result.train) == sorted(DISTINCT)
    assert result.summary["in_test_split"] == len(DISGUISES)


def _line(question: str) -> str:
    return (
        json.dumps(
            {
                "question": question,
                "answer": "999",
                "answer_format": "number",
                "verifier": "numeric",
            }
        )
        + "\n"
    )


def test_drop_folder_and_traffic_leave_out_disguised_evaluation_questions(tmp_path: Path):
    drop = tmp_path / "data" / "01_raw" / "drop"
    drop.mkdir(parents=True)
    (drop / "a.jsonl").write_text("".join(_line(q) for q in list(DISGUISES.values()) + DISTINCT))
    traffic = tmp_path / "data" / "01_raw" / "traffic"
    traffic.mkdir(parents=True)
    (traffic / "requests.jsonl").write_text(
        json.dumps(_captured("r1", DISGUISES["Cyrillic a"])) + "\n"
    )
    (traffic / "feedback.jsonl").write_text(
        json.dumps({"request_id": "r1", "time": "2026-12-01T11:00:00Z", "reference_answer": "9"})
        + "\n"
    )
    settings = sources_settings({"drop_folder": {"enabled": True}, "traffic": {"enabled": True}})
    store = FileWatermarks(tmp_path / "w.json")
    collected = collect_sources(settings, store, root=tmp_path, test_questions=SPLITS)
    assert sorted(t.question for t in collected.tasks()) == sorted(DISTINCT)
    by_source = {entry["source"]: entry for entry in collected.report()["sources"]}
    assert by_source["drop_folder"]["in_test_split"] == len(DISGUISES)
    assert by_source["traffic"]["in_test_split"] == 1


def test_the_threshold_is_a_setting(tmp_path: Path):
    drop = tmp_path / "data" / "01_raw" / "drop"
    drop.mkdir(parents=True)
    (drop / "a.jsonl").write_text(_line(DISGUISES["quoted in a longer message"]))
    settings = sources_settings(
        {"drop_folder": {"enabled": True}, "contamination": {"similarity_threshold": 1}}
    )
    store = FileWatermarks(tmp_path / "w.json")
    assert len(collect_sources(settings, store, root=tmp_path, test_questions=SPLITS).tasks()) == 1
    for bad in (0, 1.5, "high", True):
        with pytest.raises(ValueError, match="contamination.similarity_threshold"):
            sources_settings({"contamination": {"similarity_threshold": bad}})


@pytest.mark.parametrize("threshold", [0.6, 0.8, 0.99])
def test_the_index_finds_what_comparing_with_every_question_finds(threshold):
    """The rarest-n-gram filter loses no near duplicate: the same answers as a full scan."""
    rng = random.Random(threshold)
    words = ["add", "the", "sum", "of", "two", "and", "three", "ten", "spell", "wig", "wir"]

    def question() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(2, 9)))

    questions = [question() for _ in range(300)]
    index = EvaluationIndex({"test": questions}, threshold=threshold)
    keys = [normalise_question(q) for q in questions]
    for probe in [question() for _ in range(300)]:
        key = normalise_question(probe)
        scores = [containment(char_ngrams(key), char_ngrams(other)) for other in keys]
        expected = key in keys or max(scores) >= threshold
        assert (probe in index) == expected, probe


def test_the_retraining_node_checks_the_validation_split_too(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_PROJECT_ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # project_root() is memoised per working directory
    traffic = tmp_path / "data" / "01_raw" / "traffic"
    traffic.mkdir(parents=True)
    asked = [DISGUISES["validation question, Greek omicron"], "Calculate -6 + -5."]
    (traffic / "requests.jsonl").write_text(
        "".join(json.dumps(_captured(f"r{i}", q)) + "\n" for i, q in enumerate(asked))
    )
    (traffic / "feedback.jsonl").write_text(
        "".join(
            json.dumps(
                {"request_id": f"r{i}", "time": f"2026-12-01T11:0{i}Z", "reference_answer": "1"}
            )
            + "\n"
            for i in range(len(asked))
        )
    )

    def frame(question: str) -> pd.DataFrame:
        task = Task("t", "math", "easy", question, "1", "number", "numeric", "rg")
        return pd.DataFrame([task.to_record()], columns=list(Task.__dataclass_fields__))

    params = {
        "watermarks": {"store": "file", "path": "data/watermarks.json"},
        "traffic": {"enabled": True, "path": "data/01_raw/traffic"},
    }
    joined, _, report = collect_retraining_sources(
        frame("What is 2 + 2?"),
        frame(TEST_QUESTION),
        {"token": "t"},
        params,
        frame(VALIDATION_QUESTION),
    )
    assert list(joined["question"]) == ["What is 2 + 2?", "Calculate -6 + -5."]
    assert report["sources"][0]["in_test_split"] == 1
    [node] = [n for n in create_pipeline().nodes if n.name == "collect_retraining_sources"]
    assert "validation_tasks" in node.inputs
