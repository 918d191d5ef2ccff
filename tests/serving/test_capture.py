"""The opt-in capture store: off by default, what a record keeps (and never keeps), a planted
key found in no file, rotation, retention, the redaction hook, concurrent appends."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from conductor_pipeline.project import load_project_config
from conductor_pipeline.serving.capture import (
    CaptureSettings,
    CaptureStore,
    capture_record,
    utc_now,
)
from conductor_pipeline.serving.settings import serving_settings
from conductor_pipeline.tasks.sources.traffic import read_records

REPO = Path(__file__).resolve().parents[2]
PLANTED = "sk-planted-7e3c91d0b4a2f5"
DAY = 86400.0


def conductor(request_id: str = "chatcmpl-1", **extra: Any) -> dict[str, Any]:
    """A response's ``conductor`` record, shaped as serving.responses writes it."""
    return {
        "request_id": request_id,
        "model": {
            "id": "conductor/3",
            "version": "3",
            "registered_model": "conductor",
            "alias": "champion",
            "source": "models:/conductor@champion",
            "policy": "local",
        },
        "steps": [
            {
                "index": 0,
                "worker": 1,
                "worker_name": "sim-math",
                "subtask": "Compute 6 * 7.",
                "access": [],
                "response": "42",
                "tokens": 15,
                "cost_usd": 0.001,
                "latency_s": 0.2,
                "failure": None,
                "error": None,
                "skipped_reason": None,
            }
        ],
        "cost_usd": 0.001,
        "tokens": 15,
        "conductor_tokens": 40,
        "simulated": False,
        "sandbox_known_question": True,
        "format_failure": False,
        "stopped_by": None,
        "trace_id": None,
        **extra,
    }


def store(tmp_path: Path, **settings: Any) -> CaptureStore:
    return CaptureStore(CaptureSettings(enabled=True, path="capture", **settings), tmp_path)


def files_text(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------ settings


def test_capture_is_off_in_every_shipped_profile():
    for env, folder in (("base", "data"), ("gpu", "data/gpu")):
        settings = serving_settings(load_project_config(env, root=REPO).parameters["serving"])
        assert settings.capture.enabled is False
        # the documented defaults are the conf's, in the profile's own data tree
        assert settings.capture.path == f"{folder}/01_raw/traffic"
        assert (
            dataclasses.replace(settings.capture, path=CaptureSettings().path) == CaptureSettings()
        )


@pytest.mark.parametrize(
    "capture, phrase",
    [
        ({"enabld": True}, "serving.capture: unknown key 'enabld' (did you mean 'enabled'?)"),
        ({"enabled": "yes"}, "serving.capture.enabled"),
        ({"max_file_bytes": 10}, "serving.capture.max_file_bytes"),
        ({"keep_files": -1}, "serving.capture.keep_files"),
        ({"max_age_days": 0}, "serving.capture.max_age_days"),
        ({"max_records": 0}, "serving.capture.max_records"),
        ({"redact": "no_colon"}, "serving.capture.redact"),
        ("on", "serving.capture: must be a mapping"),
    ],
)
def test_bad_capture_settings_name_the_key(capture, phrase):
    with pytest.raises(ValueError) as err:
        serving_settings({"capture": capture})
    assert phrase in str(err.value)


def test_an_unimportable_redaction_hook_fails_at_start_up(tmp_path):
    with pytest.raises(ValueError, match="serving.capture.redact: cannot import"):
        store(tmp_path, redact="tests.serving.test_capture:no_such_function")


# ------------------------------------------------------------------------------ off / on


def test_capture_off_writes_nothing(tmp_path):
    off = CaptureStore(CaptureSettings(path="capture"), tmp_path)
    assert off.append(capture_record("What is 6 times 7?", "42", conductor())) is False
    assert not (tmp_path / "capture").exists()
    assert off.contains("chatcmpl-1") is False
    assert off.describe()["enabled"] is False and off.describe()["stores"] == []


def test_a_record_keeps_the_question_workflow_answer_cost_and_version(tmp_path):
    on = store(tmp_path)
    assert on.append(capture_record("What is 6 times 7?", "42", conductor()))
    [record] = on.records()
    assert record["request_id"] == "chatcmpl-1" and record["question"] == "What is 6 times 7?"
    assert record["answer"] == "42" and record["model"]["id"] == "conductor/3"
    assert record["steps"] == [
        {
            "worker": 1,
            "worker_name": "sim-math",
            "subtask": "Compute 6 * 7.",
            "access": [],
            "tokens": 15,
            "cost_usd": 0.001,
            "ok": True,
        }
    ]
    assert record["cost_usd"] == 0.001 and record["tokens"] == 15 and record["simulated"] is False
    assert on.contains("chatcmpl-1") and not on.contains("chatcmpl-2")
    described = on.describe()
    assert described["enabled"] and described["path"] == "capture"
    assert described["retention"] == {"max_age_days": 30.0, "max_records": None}


def test_a_planted_key_reaches_no_capture_file(tmp_path, monkeypatch):
    """The key is in the environment, in fields a caller slipped into the record (headers,
    credentials), in a worker's error text and response, and pasted into the question: the
    question keeps its words, the key itself appears in no file of the folder."""
    monkeypatch.setenv("CONDUCTOR_API_KEY", PLANTED)
    monkeypatch.setenv("OPENAI_API_KEY", PLANTED)
    record = conductor(
        headers={"Authorization": f"Bearer {PLANTED}"},
        credentials={"conductor_api_key": PLANTED},
        environment={"CONDUCTOR_API_KEY": PLANTED},
    )
    record["steps"][0].update(error=f"401 from provider: key {PLANTED}", response=PLANTED)
    record["model"]["source"] = f"https://user:{PLANTED}@example.invalid/adapter"
    on = CaptureStore(
        CaptureSettings(enabled=True, path="capture"), tmp_path, secrets=[PLANTED, "short"]
    )
    on.append(capture_record(f"my key is {PLANTED}, what is 6 times 7?", "42", record))
    text = files_text(tmp_path / "capture")
    assert "what is 6 times 7?" in text and "my key is ***" in text
    assert PLANTED not in text and "Authorization" not in text


def test_a_served_request_with_a_planted_key_leaves_no_trace_in_the_capture(tmp_path, monkeypatch):
    """Over the real API (in process, fake pool): the planted key is the server's key, in
    the request's Authorization header and in the environment; the capture built from the
    response's own record holds the question and no key."""
    from conductor_pipeline.serving.models import ServedModel
    from conductor_pipeline.serving.server import BackgroundServer
    from conductor_pipeline.serving.service import ConductorService
    from conductor_pipeline.serving.settings import ServingSettings
    from conductor_pipeline.workers.types import Usage, WorkerReply
    from conductor_pipeline.workflow import OrchestrationConfig, PromptConfig
    from conductor_pipeline.workflow.executor import Budget
    from conductor_pipeline.workflow.policy import ScriptedPolicy

    async def pool(worker, messages, sample_index=0):
        return WorkerReply(f"w{worker}", "42", Usage(prompt_tokens=10, completion_tokens=2))

    service = ConductorService(
        policy=ScriptedPolicy(worker=1),
        call_worker=pool,
        descriptions=["generalist", "maths"],
        worker_names=["alpha", "beta"],
        orchestration=OrchestrationConfig(
            prompt=PromptConfig(assistant_prefill="model_id = ["),
            budget=Budget(max_steps=5, max_tokens=None, max_cost_usd=None),
        ),
        served=ServedModel(version="7", registered_name="conductor", alias="champion", policy="t"),
        settings=ServingSettings(),
        api_key=PLANTED,
    )
    monkeypatch.setenv("CONDUCTOR_API_KEY", PLANTED)
    with BackgroundServer(service) as running:
        running.wait_ready()
        response = httpx.post(
            f"{running.base_url}/chat/completions",
            json={
                "model": "conductor",
                "messages": [{"role": "user", "content": "What is 6 times 7?"}],
            },
            headers={"Authorization": f"Bearer {PLANTED}", "X-Api-Key": PLANTED},
            timeout=30,
        )
    assert response.status_code == 200, response.text
    body = response.json()
    on = CaptureStore(CaptureSettings(enabled=True, path="capture"), tmp_path, secrets=[PLANTED])
    on.append(
        capture_record(
            "What is 6 times 7?", body["choices"][0]["message"]["content"], body["conductor"]
        )
    )
    [record] = on.records()
    assert record["request_id"] == body["id"] and record["steps"]
    assert record["model"]["id"] == body["conductor"]["model"]["id"]
    assert PLANTED not in files_text(tmp_path / "capture")


# ------------------------------------------------------------------------------ rotation, retention


def test_rotation_keeps_the_newest_files_and_reads_oldest_first(tmp_path):
    on = store(tmp_path, max_file_bytes=2048, keep_files=2, max_age_days=None)
    for n in range(40):
        on.append(capture_record(f"question {n}", str(n), conductor(f"r{n:02d}")))
    folder = tmp_path / "capture"
    names = sorted(p.name for p in folder.glob("requests*.jsonl"))
    assert names == ["requests.1.jsonl", "requests.2.jsonl", "requests.jsonl"]
    assert all(p.stat().st_size <= 2048 for p in folder.glob("requests*.jsonl"))
    ids = [r["request_id"] for r in on.records()]
    assert ids == sorted(ids) and ids[-1] == "r39" and ids[0] != "r00"  # oldest dropped
    assert not on.contains("r00") and on.contains("r39")


def test_keep_files_zero_keeps_only_the_current_file(tmp_path):
    on = store(tmp_path, max_file_bytes=1024, keep_files=0, max_age_days=None)
    for n in range(20):
        on.append(capture_record(f"question {n}", str(n), conductor(f"r{n:02d}")))
    assert [p.name for p in (tmp_path / "capture").glob("requests*.jsonl")] == ["requests.jsonl"]
    assert on.records()[-1]["request_id"] == "r19"


def test_retention_by_age_and_count_applies_at_start_up(tmp_path):
    now = 1_800_000_000.0
    on = CaptureStore(CaptureSettings(enabled=True, path="capture", max_age_days=None), tmp_path)
    for n, age_days in enumerate([40, 35, 20, 10, 1]):
        on.append(
            capture_record(
                f"q{n}",
                "a",
                conductor(f"r{n}"),
                time_text=utc_now(lambda a=age_days: now - a * DAY),
            )
        )
    aged = CaptureStore(
        CaptureSettings(enabled=True, path="capture", max_age_days=30), tmp_path, clock=lambda: now
    )
    assert [r["request_id"] for r in aged.records()] == ["r2", "r3", "r4"]
    counted = CaptureStore(
        CaptureSettings(enabled=True, path="capture", max_age_days=30, max_records=2),
        tmp_path,
        clock=lambda: now,
    )
    assert [r["request_id"] for r in counted.records()] == ["r3", "r4"]
    assert not counted.contains("r2")


def test_a_second_process_finds_requests_the_first_wrote(tmp_path, monkeypatch):
    """Two servers on one folder: ids the other wrote are found by reading only what it
    appended; a rotation by the other makes the store read everything again."""
    one = store(tmp_path, max_file_bytes=4096, keep_files=3, max_age_days=None)
    one.append(capture_record("q0", "a", conductor("r0")))
    two = store(tmp_path, max_file_bytes=4096, keep_files=3, max_age_days=None)
    full_reads = []  # a full re-read of the ids is a read of every record
    every_record = two.records
    monkeypatch.setattr(two, "records", lambda: full_reads.append(1) or every_record())
    one.append(capture_record("q1", "a", conductor("r1")))
    assert two.contains("r1") and full_reads == []
    assert not two.contains("r-unknown") and not two.contains("r-unknown")
    assert full_reads == []  # unknown ids cost no full re-read
    for n in range(30):  # one rotates the file under two
        one.append(capture_record(f"question {n} " + "x" * 200, "a", conductor(f"s{n}")))
    assert two.contains("s29") and full_reads == [1]
    assert two.contains("r1") == one.contains("r1")


# ------------------------------------------------------------------------------ redaction


def mask_digits(record: dict[str, Any]) -> dict[str, Any]:
    """A redaction hook for the tests: digits of the question and answer become '#'."""
    for key in ("question", "answer"):
        record[key] = "".join("#" if c.isdigit() else c for c in record[key])
    return record


def skip_private(record: dict[str, Any]) -> dict[str, Any] | None:
    return None if "private" in record["question"] else record


def drop_request_id(record: dict[str, Any]) -> dict[str, Any]:
    return {"question": record["question"]}


def test_the_redaction_hook_runs_before_writing(tmp_path):
    on = store(tmp_path, redact="tests.serving.test_capture:mask_digits")
    on.append(capture_record("What is 6 times 7?", "42", conductor()))
    record = on.records()[0]
    assert (record["question"], record["answer"]) == ("What is # times #?", "##")
    # Whole phrases, not bare digits: a timestamp in the record may hold any digits.
    text = files_text(tmp_path / "capture")
    assert "6 times 7" not in text and '"answer": "42"' not in text


def test_a_hook_may_skip_a_record_but_not_drop_its_id(tmp_path):
    skipping = store(tmp_path, redact="tests.serving.test_capture:skip_private")
    assert skipping.append(capture_record("a private matter", "x", conductor("r1"))) is False
    assert skipping.append(capture_record("a public one", "y", conductor("r2"))) is True
    assert [r["request_id"] for r in skipping.records()] == ["r2"]
    broken = store(tmp_path / "b", redact="tests.serving.test_capture:drop_request_id")
    with pytest.raises(ValueError, match="must return the record"):
        broken.append(capture_record("q", "a", conductor()))


# ------------------------------------------------------------------------------ concurrency, crashes


def test_appends_from_many_threads_and_tasks_stay_whole_lines(tmp_path):
    on = store(tmp_path, max_file_bytes=64 * 1024, keep_files=50, max_age_days=None)

    def worker(thread: int) -> None:
        for n in range(25):
            on.append(
                capture_record(
                    f"thread {thread} question {n} " + "x" * 300, "a", conductor(f"t{thread}-{n}")
                )
            )

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()

    async def many() -> None:
        await asyncio.gather(
            *(
                on.append_async(capture_record(f"async {n}", "a", conductor(f"a{n}")))
                for n in range(50)
            )
        )

    asyncio.run(many())
    for thread in threads:
        thread.join()
    records, unreadable = read_records(tmp_path / "capture", "requests")
    assert unreadable == 0
    assert len({r["request_id"] for r in records}) == len(records) == 8 * 25 + 50
    assert len(list((tmp_path / "capture").glob("requests.*.jsonl"))) >= 1  # it did rotate


def test_a_line_cut_short_by_a_crash_is_skipped_and_the_next_one_kept(tmp_path):
    on = store(tmp_path)
    on.append(capture_record("first", "1", conductor("r1")))
    with (tmp_path / "capture" / "requests.jsonl").open("a") as handle:
        handle.write('{"request_id": "r-torn", "question": "cut sh')
    on.append(capture_record("third", "3", conductor("r3")))
    records, unreadable = read_records(tmp_path / "capture", "requests")
    assert [r["request_id"] for r in records] == ["r1", "r3"] and unreadable == 1


def test_records_are_strict_json(tmp_path):
    on = store(tmp_path)
    on.append(capture_record("q", "a", conductor(cost_usd=float("nan"), tokens=3)))
    line = (tmp_path / "capture" / "requests.jsonl").read_text()
    assert json.loads(line)["cost_usd"] is None and "NaN" not in line
