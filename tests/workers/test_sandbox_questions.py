"""Whether the sandbox knows a question: decided on its task index, asked of a real sandbox
server over HTTP, and attached by ``open_worker_pool`` only to a pool with simulated workers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pandas as pd
import pytest

from conductor_pipeline.tasks.types import Task
from conductor_pipeline.workers.runtime import open_worker_pool
from conductor_pipeline.workers.sandbox import (
    UNKNOWN_QUESTION_WARNING,
    SandboxQuestionCheck,
    SandboxServer,
    TaskIndex,
    recognise,
)

from .conftest import worker_entry

PREPARED = (
    "A gardener plants 12 rows of 9 tulips and 4 rows of 15 daffodils. How many flowers "
    "does the gardener plant in total?"
)
TASKS = [Task("q/1", "math", "easy", PREPARED, "168", "number", "numeric", "hand")]
UNKNOWN = "What is 9 * 8?"


def test_recognise_on_the_index():
    index = TaskIndex(TASKS)
    known = recognise(index, PREPARED)
    assert known.known and known.task_id == "q/1" and known.coverage == 1.0
    assert known.warning is None
    # context around the question does not hide it
    assert recognise(index, f"Earlier turns: hello.\n\n{PREPARED}").known
    unknown = recognise(index, UNKNOWN)
    assert not unknown.known and unknown.task_id is None
    assert unknown.warning == UNKNOWN_QUESTION_WARNING
    # a fragment of a prepared question is recognised but not answered for real: unknown
    fragment = recognise(index, "A gardener plants 12 rows of 9 tulips and something else")
    assert not fragment.known and fragment.task_id == "q/1" and 0 < fragment.coverage < 0.6
    # another number: the simulated workers see the prepared task (over 60 % of its
    # 6-grams) and would answer 168, which is not this question's answer
    other = recognise(index, PREPARED.replace("15 daffodils", "16 daffodils"))
    assert other.task_id == "q/1" and 0.6 <= other.coverage < 1.0 and not other.known
    # case and spacing do not matter
    assert recognise(index, PREPARED.upper().replace("?", " ? ")).known
    short = TaskIndex(
        [Task("q/2", "math", "easy", "Calculate 9 * 3.", "27", "number", "numeric", "x")]
    )
    assert recognise(short, "Calculate 9 * 3.").known
    assert recognise(short, "calculate 9 *3").known
    assert not recognise(short, "Calculate 9 * 4.").known
    # the question must not run on into a longer number; words after it are fine
    assert not recognise(short, "Calculate 9 * 3.5").known
    assert not recognise(short, "Calculate 9 * 35.").known
    assert recognise(short, "Calculate 9 * 3. Thanks!").known
    # same words, another operator: another question, not this one
    plus = recognise(short, "Calculate 9 + 3.")
    assert not plus.known and plus.task_id is None


def test_the_warning_names_what_to_do_and_fits_a_header():
    assert "conductor ask --sample" in UNKNOWN_QUESTION_WARNING
    assert 'docs/sandbox.md, "Adding a real provider"' in UNKNOWN_QUESTION_WARNING
    UNKNOWN_QUESTION_WARNING.encode("ascii")  # HTTP header values are latin-1


@pytest.fixture(scope="module")
def sandbox() -> Iterator[SandboxServer]:
    with SandboxServer(tasks=TASKS, load_real_model=False, latency_scale=0.0) as server:
        yield server


def test_the_server_answers_the_check_over_http(sandbox):
    check = SandboxQuestionCheck(sandbox.url)
    known = asyncio.run(check(PREPARED))
    assert known is not None and known.known and known.task_id == "q/1"
    unknown = asyncio.run(check(UNKNOWN))
    assert unknown is not None and not unknown.known
    body = httpx.post(f"{sandbox.url}/sandbox/recognise", json={"text": UNKNOWN}).json()
    assert body == {"known": False, "task_id": None, "coverage": 0.0, "tasks": 1}


@pytest.mark.parametrize("payload", [{"question": "x"}, [1], {"text": 3}])
def test_a_bad_check_request_is_a_400_that_says_why(sandbox, payload):
    response = httpx.post(f"{sandbox.url}/sandbox/recognise", json=payload)
    assert response.status_code == 400
    assert '{"text": "<question>"}' in response.json()["error"]["message"]


def test_a_check_that_cannot_reach_the_sandbox_says_nothing(caplog):
    # port 9 (discard) on loopback: nothing listens there in the test machine
    assert asyncio.run(SandboxQuestionCheck("http://127.0.0.1:9", timeout_s=2)(UNKNOWN)) is None
    assert "could not say" in caplog.text


def _sandbox_pool(tmp_path: Path, workers: list[str]) -> dict:
    tasks = tmp_path / "tasks.parquet"
    pd.DataFrame([t.to_record() for t in TASKS]).to_parquet(tasks)
    return {
        "kind": "sandbox",
        "cache": {"mode": "off"},
        "sandbox": {
            "workers": workers,
            "load_real_model": False,
            "latency_scale": 0.0,
            "tasks": [str(tasks)],
        },
    }


def test_a_sandbox_pool_with_simulated_workers_gets_the_check(tmp_path):
    config = _sandbox_pool(tmp_path, ["sim-sage", "smollm2-135m"])
    with open_worker_pool(config, root=tmp_path) as pool:
        assert pool.question_check is not None
        assert asyncio.run(pool.question_check(UNKNOWN)).known is False
        assert asyncio.run(pool.question_check(PREPARED)).known is True


def test_a_sandbox_of_real_models_only_gets_no_check(tmp_path):
    with open_worker_pool(_sandbox_pool(tmp_path, ["smollm2-135m"]), root=tmp_path) as pool:
        assert pool.question_check is None


def test_a_configured_pool_of_real_providers_gets_no_check(tmp_path, fake_server):
    config = {"kind": "configured", "workers": [worker_entry(fake_server, "real-model")]}
    with open_worker_pool(config, root=tmp_path) as pool:
        assert pool.question_check is None
