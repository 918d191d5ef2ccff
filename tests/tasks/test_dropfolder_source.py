"""Sources that grow: the drop folder read from a position watermark, LiveCodeBench windowed
by contest_date (fixture rows, no network), the file watermark store, settings, and the
collect-then-commit cycle a scheduled run goes through."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from conductor_pipeline.project import load_project_config
from conductor_pipeline.serving.capture import CaptureSettings, CaptureStore, capture_record
from conductor_pipeline.serving.feedback import FeedbackStore, parse_feedback
from conductor_pipeline.tasks import Task
from conductor_pipeline.tasks.sources.benchmarks import read_local_rows
from conductor_pipeline.tasks.sources.dropfolder import (
    FileWatermarks,
    commit,
    iso_date,
    livecodebench_window,
    read_drop_folder,
)
from conductor_pipeline.tasks.sources.growing import (
    collect_sources,
    commit_all,
    join_training,
    sources_settings,
)

REPO = Path(__file__).resolve().parents[2]
LCB_FIXTURE = REPO / "tests" / "fixtures" / "benchmarks" / "livecodebench.jsonl"


def line(question: str, answer: str | None = "1", **extra: Any) -> str:
    row: dict[str, Any] = {"question": question}
    if answer is not None:
        row.update(answer=answer, answer_format="number", verifier="numeric")
    return json.dumps({**row, **extra}) + "\n"


def write(path: Path, *lines: str, mode: str = "a") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open(mode, encoding="utf-8") as handle:
        handle.write("".join(lines))


# ------------------------------------------------------------------------------ drop folder


def test_each_run_takes_only_new_lines_and_new_files(tmp_path):
    folder = tmp_path / "drop"
    write(folder / "a.jsonl", line("Compute 1 + 0."), line("Compute 2 + 0.", "2"))
    first = read_drop_folder(folder)
    assert [t.question for t in first.tasks] == ["Compute 1 + 0.", "Compute 2 + 0."]
    assert first.tasks[0].id.startswith("drop_folder/") and first.tasks[0].source == "drop_folder"
    assert first.advanced and not first.unchanged

    again = read_drop_folder(folder, first.watermark)
    assert again.unchanged and not again.advanced and again.watermark == first.watermark

    write(folder / "a.jsonl", line("Compute 3 + 0.", "3"))
    write(folder / "b.jsonl", line("Compute 4 + 0.", "4"))
    second = read_drop_folder(folder, first.watermark)
    assert [t.question for t in second.tasks] == ["Compute 3 + 0.", "Compute 4 + 0."]
    assert read_drop_folder(folder, second.watermark).unchanged


def test_a_line_still_being_written_waits_for_the_next_run(tmp_path):
    folder = tmp_path / "drop"
    write(folder / "a.jsonl", line("Compute 1 + 0."), '{"question": "Compute 2')
    first = read_drop_folder(folder)
    assert [t.question for t in first.tasks] == ["Compute 1 + 0."] and not first.summary["invalid"]
    write(
        folder / "a.jsonl",
        ' + 0.", "answer": "2", "answer_format": "number", "verifier": "numeric"}\n',
    )
    second = read_drop_folder(folder, first.watermark)
    assert [t.question for t in second.tasks] == ["Compute 2 + 0."]


def test_a_rewritten_file_is_read_again_and_reported(tmp_path):
    folder = tmp_path / "drop"
    write(folder / "a.jsonl", line("Compute 1 + 0."))
    first = read_drop_folder(folder)
    write(folder / "a.jsonl", line("Compute 9 + 0.", "9"), mode="w")
    second = read_drop_folder(folder, first.watermark)
    assert second.summary["rewritten"] == ["a.jsonl"]
    assert [t.question for t in second.tasks] == ["Compute 9 + 0."]


def test_lines_without_a_reference_or_malformed_are_counted_with_where(tmp_path):
    folder = tmp_path / "drop"
    write(
        folder / "a.jsonl",
        line("Compute 1 + 0."),
        line("No reference here.", None),
        "not json\n",
        "[1, 2]\n",
        line("", "1"),
        line("Bad verifier.", "1", verifier="telepathy"),
        line("Compute 1 + 0 again.", "1", id="same"),
        line("Compute 2 + 0 again.", "2", id="same"),
    )
    batch = read_drop_folder(folder)
    assert [t.id for t in batch.tasks][1:] == ["same"]
    assert batch.summary["without_reference"] == 1 and batch.summary["new_lines"] == 8
    invalid = batch.summary["invalid"]
    assert [entry.split(":")[1] for entry in invalid] == ["3", "4", "5", "6", "8"]
    assert "not JSON" in invalid[0] and "no question" in invalid[2]
    assert "unknown verifier" in invalid[3] and "repeats id 'same'" in invalid[4]


def test_the_date_window_filters_by_a_field(tmp_path):
    folder = tmp_path / "drop"
    write(
        folder / "a.jsonl",
        line("Early question.", date="2026-01-01"),
        line("In the window.", date="2026-03-01T12:00:00Z"),
        line("Last day counts.", date="2026-03-31T23:00:00"),
        line("Too late.", date="2026-04-01"),
        line("No date."),
    )
    batch = read_drop_folder(
        folder, date_field="date", start_date="2026-02-01", end_date="2026-03-31"
    )
    assert [t.question for t in batch.tasks] == ["In the window.", "Last day counts."]
    assert (
        batch.summary["outside_window"] == 2 and "no readable 'date'" in batch.summary["invalid"][0]
    )
    with pytest.raises(ValueError, match="start_date"):
        read_drop_folder(folder, date_field="date", start_date="March")


def test_a_missing_folder_or_a_bad_watermark(tmp_path):
    assert read_drop_folder(tmp_path / "none").unchanged
    with pytest.raises(ValueError, match="unreadable watermark"):
        read_drop_folder(tmp_path, "not json")


# ------------------------------------------------------------------------------ LiveCodeBench


def test_livecodebench_is_windowed_by_contest_date():
    rows = read_local_rows(LCB_FIXTURE)  # contests 2023-05-20, 2024-08-10, 2024-06-02, 2025-02-15
    first = livecodebench_window(rows, None, end_date="2024-12-31")
    assert [t.id for t in first.tasks] == [
        "livecodebench/abc999_a",
        "livecodebench/3421",
        "livecodebench/1999B",
    ]
    assert first.watermark == "2024-08-10T00:00:00" and first.summary["outside_window"] == 1
    second = livecodebench_window(rows, first.watermark)
    assert [t.id for t in second.tasks] == ["livecodebench/arc999_c"]
    assert second.summary["older_than_watermark"] == 3
    third = livecodebench_window(rows, second.watermark)
    assert third.unchanged and not third.advanced and third.watermark == second.watermark


def test_livecodebench_rows_without_a_date_are_counted():
    rows = read_local_rows(LCB_FIXTURE)
    rows[0] = {**rows[0], "contest_date": None}
    batch = livecodebench_window(rows, None, start_date=dt.date(2024, 1, 1))
    assert batch.summary["no_contest_date"] == 1 and len(batch.tasks) == 3


@pytest.mark.parametrize(
    "value, expected",
    [
        ("2024-08-10", "2024-08-10T00:00:00"),
        ("2024-08-10T05:06:07", "2024-08-10T05:06:07"),
        ("2024-08-10T05:06:07+02:00", "2024-08-10T03:06:07"),
        (dt.date(2024, 8, 10), "2024-08-10T00:00:00"),
        ("soon", None),
        (None, None),
    ],
)
def test_iso_date(value, expected):
    assert iso_date(value) == expected


# ------------------------------------------------------------------------------ watermarks, settings


def test_file_watermarks_keep_one_value_per_source(tmp_path):
    store = FileWatermarks(tmp_path / "marks" / "w.json")
    assert store.read("drop_folder") is None
    store.write("drop_folder", "a")
    store.write("livecodebench", "2024-08-10T00:00:00")
    store.write("drop_folder", "b")
    assert FileWatermarks(tmp_path / "marks" / "w.json").read("drop_folder") == "b"
    assert store.read("livecodebench") == "2024-08-10T00:00:00"
    assert [p.name for p in (tmp_path / "marks").iterdir()] == ["w.json"]  # no temporary left


def test_the_watermark_is_written_only_by_commit(tmp_path):
    folder = tmp_path / "drop"
    write(folder / "a.jsonl", line("Compute 1 + 0."))
    store = FileWatermarks(tmp_path / "w.json")
    batch = read_drop_folder(folder, store.read("drop_folder"))
    # the run failed before committing: the next one takes the same lines again
    assert read_drop_folder(folder, store.read("drop_folder")).tasks == batch.tasks
    assert commit(store, batch) is True
    assert read_drop_folder(folder, store.read("drop_folder")).unchanged
    assert commit(store, read_drop_folder(folder, store.read("drop_folder"))) is False


def test_shipped_settings_are_off_and_bad_ones_name_the_key():
    for env in ("base", "gpu"):
        settings = sources_settings(
            load_project_config(env, root=REPO).parameters["retraining_sources"]
        )
        assert not (
            settings.traffic.enabled
            or settings.drop_folder.enabled
            or settings.livecodebench.enabled
        )
    for params, phrase in [
        ({"trafic": {}}, "retraining_sources: unknown key 'trafic' (did you mean 'traffic'?)"),
        ({"traffic": {"enabled": "yes"}}, "retraining_sources.traffic.enabled"),
        ({"drop_folder": {"path": ""}}, "retraining_sources.drop_folder.path"),
        ({"drop_folder": {"start_date": "soon"}}, "retraining_sources.drop_folder.start_date"),
        (
            {"livecodebench": {"windows": 1}},
            "retraining_sources.livecodebench: unknown key 'windows'",
        ),
        ({"watermarks": {"store": "redis"}}, "retraining_sources.watermarks.store"),
        ({"traffic": []}, "retraining_sources.traffic: must be a mapping"),
    ]:
        with pytest.raises(ValueError) as err:
            sources_settings(params)
        assert phrase in str(err.value)


# ------------------------------------------------------------------------------ one scheduled run after another


def test_two_scheduled_runs_the_second_with_nothing_new(tmp_path):
    """Traffic with feedback, a drop folder and LiveCodeBench rows, collected from the
    stored watermarks, committed after the 'run'; the next collection is unchanged."""
    capture = CaptureStore(CaptureSettings(enabled=True, path="data/01_raw/traffic"), tmp_path)
    feedback = FeedbackStore(capture)
    for request_id, question in [("r1", "Compute 5 + 6."), ("r2", "Name a prime above 10.")]:
        capture.append(capture_record(question, "11", {"request_id": request_id, "steps": []}))
    feedback.submit(parse_feedback({"request_id": "r1", "reference_answer": "11"}))
    feedback.submit(parse_feedback({"request_id": "r2", "verdict": "right"}))
    write(tmp_path / "data" / "01_raw" / "drop" / "x.jsonl", line("Compute 7 + 0.", "7"))
    settings = sources_settings(
        {
            "traffic": {"enabled": True},
            "drop_folder": {"enabled": True},
            "livecodebench": {"enabled": True, "data_files": str(LCB_FIXTURE)},
        }
    )
    store = FileWatermarks(tmp_path / "w.json")
    first = collect_sources(settings, store, root=tmp_path, test_questions=["Compute 9 + 9."])
    assert [t.id for t in first.tasks()][:1] == ["traffic/r1"] and len(first.tasks()) == 1 + 1 + 4
    assert [row["request_id"] for row in first.evaluation] == ["r2"] and not first.unchanged
    assert sorted(commit_all(store, first)) == ["drop_folder", "livecodebench", "traffic"]
    # what was committed is what the report (stored as JSON by the run) says
    marks = FileWatermarks(tmp_path / "from-report.json")
    assert sorted(commit_all(marks, json.loads(json.dumps(first.report())))) == [
        "drop_folder",
        "livecodebench",
        "traffic",
    ]
    assert all(marks.read(s) == store.read(s) for s in ("drop_folder", "livecodebench", "traffic"))
    second = collect_sources(settings, store, root=tmp_path, test_questions=[])
    assert second.unchanged and second.report()["unchanged"] and commit_all(store, second) == []
    feedback.submit(parse_feedback({"request_id": "r2", "verdict": "right"}))  # a retry: same
    assert collect_sources(settings, store, root=tmp_path, test_questions=[]).unchanged


def test_no_source_brings_a_test_question_or_a_question_twice(tmp_path):
    drop = tmp_path / "data" / "01_raw" / "drop"
    write(
        drop / "a.jsonl",
        line("Compute 9 + 9.", "18"),  # a test-split question
        line("Compute 1 + 2.", "3"),
    )
    write(drop / "b.jsonl", line("compute 1 + 2", "3", id="again"))  # same question, other file
    settings = sources_settings({"drop_folder": {"enabled": True}})
    store = FileWatermarks(tmp_path / "w.json")
    collected = collect_sources(settings, store, root=tmp_path, test_questions=["COMPUTE 9+9"])
    assert [t.question for t in collected.tasks()] == ["Compute 1 + 2."]
    [report] = collected.report()["sources"]
    assert report["in_test_split"] == 1 and report["repeated_in_run"] == 1
    assert report["tasks"] == 1 and not report["unchanged"]


def test_new_tasks_join_the_training_split_without_repeats():
    def task(task_id: str, question: str) -> Task:
        return Task(task_id, "math", "easy", question, "1", "number", "numeric", "s")

    train = [task("a", "Compute 1 + 0."), task("b", "Compute 2 - 1.")]
    new = [task("n1", "compute 1 + 0"), task("b", "Other question."), task("n2", "Compute 3 - 2.")]
    joined, left_out = join_training(train, new)
    assert [t.id for t in joined] == ["a", "b", "n2"] and left_out == ["n1", "b"]
