"""The retraining pipeline's own nodes: the run-level lock and logged questions as an extra
task source."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pandas as pd
import pytest

from conductor_pipeline.pipelines.retraining.nodes import (
    RetrainingLocked,
    acquire_lock,
    add_logged_questions,
    release_lock,
)
from conductor_pipeline.tasks import Task


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_PROJECT_ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # project_root() is memoised per working directory
    return tmp_path


def params(**logged) -> dict:
    return {
        "lock": {"path": "data/retraining.lock", "stale_after_s": 3600},
        "logged_questions": {"paths": ["logs/*.jsonl"], "domain": "logged", **logged},
    }


def test_a_second_run_is_refused_while_the_first_holds_the_lock(root):
    claim = acquire_lock(params())
    lock = root / "data" / "retraining.lock"
    assert json.loads(lock.read_text())["token"] == claim["token"]
    with pytest.raises(RetrainingLocked, match="another retraining run holds"):
        acquire_lock(params())
    report = release_lock(
        claim, {"version": "2", "decision": "refused"}, "<html>", "<html>", {}, params()
    )
    assert report["lock_released"] and report["decision"] == "refused"
    assert not lock.exists()
    acquire_lock(params())  # free again


def test_an_abandoned_lock_is_taken_over(root):
    lock = root / "data" / "retraining.lock"
    lock.parent.mkdir(parents=True)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = {
        "token": "old",
        "pid": int(dead.stdout),
        "host": socket.gethostname(),
        "started_at": time.time(),
    }
    lock.write_text(json.dumps(stale))
    claim = acquire_lock(params())
    assert json.loads(lock.read_text())["token"] == claim["token"] != "old"

    old = {
        "token": "older",
        "pid": os.getpid(),
        "host": "elsewhere",
        "started_at": time.time() - 7200,
    }
    lock.write_text(json.dumps(old))
    assert acquire_lock(params())["token"] != "older"

    # a lock taken over by someone else is not removed by the run that lost it
    report = release_lock(claim, {}, "", "", {}, params())
    assert not report["lock_released"] and lock.exists()


def test_logged_questions_with_a_reference_join_the_raw_tasks(root):
    configured = pd.DataFrame(
        [Task("rg/1", "math", "easy", "What is 2 + 2?", "4", "number", "numeric", "rg").to_record()]
    )
    logs = root / "logs"
    logs.mkdir()
    lines = [
        {
            "question": "What is 6 * 7?",
            "answer": "42",
            "answer_format": "number",
            "verifier": "numeric",
        },
        {"question": "Is water wet?"},  # no reference answer: counted, not used
        {"question": "Sort b, a", "answer": "a, b", "answer_format": "text", "verifier": "nope"},
        "not an object",
    ]
    (logs / "api.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n{broken\n")
    combined, summary = add_logged_questions(configured, {"token": "t"}, params())
    assert len(combined) == 2
    added = Task.from_record(combined.iloc[1].to_dict())
    assert added.domain == "logged" and added.source == "logged" and added.answer == "42"
    assert added.id.startswith("logged/")
    assert summary["added"] == 1 and summary["without_reference"] == 1
    assert len(summary["invalid"]) == 3 and any("unknown verifier" in x for x in summary["invalid"])


def test_no_logged_questions_leaves_the_configured_tasks_as_they_are(root):
    configured = pd.DataFrame(
        [Task("rg/1", "math", "easy", "What is 2 + 2?", "4", "number", "numeric", "rg").to_record()]
    )
    combined, summary = add_logged_questions(configured, {"token": "t"}, params())
    assert combined is configured and summary["files"] == [] and summary["added"] == 0


def test_unknown_keys_are_named():
    with pytest.raises(
        ValueError, match=r"retraining: unknown key 'lokc' \(did you mean 'lock'\?\)"
    ):
        acquire_lock({"lokc": {}})
