"""``conductor serve`` for real: a subprocess on the sandbox, called through the official
OpenAI client and through litellm as a provider; auth, logs, errors, graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import httpx
import litellm
import openai
import pytest

from .conftest import API_KEY, QUESTION, ServeProcess, make_project, serve_env


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return (
        Path(f"/proc/{pid}").exists()
        and "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    )


def _client(served: ServeProcess, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url, api_key=key, max_retries=0, timeout=60)


def _check_record(record: dict, answer: str) -> None:
    assert record["model"]["id"] == "conductor/base" and record["model"]["version"] == "base"
    assert record["model"]["policy"] == "scripted:worker-1"
    (step,) = record["steps"]
    assert step["worker_name"] == "sim-abacus" and step["subtask"] == QUESTION
    assert step["response"] == answer
    assert record["workers"] == ["sim-abacus"]
    assert record["worker_calls"] == 1 and record["tokens"] > 0
    # zero when the response cache answered (repeated question)
    assert record["cost_usd"] == pytest.approx(step["cost_usd"]) and record["cost_usd"] >= 0
    assert record["latency_s"] >= 0 and len(record["rounds"]) == 1
    assert record["budget"]["max_steps"] == 5


def test_openai_client_gets_answer_and_workflow(served):
    response = _client(served).chat.completions.create(
        model="conductor", messages=[{"role": "user", "content": QUESTION}]
    )
    answer = response.choices[0].message.content
    assert "5555" in answer
    assert response.choices[0].finish_reason == "stop"
    record = response.model_extra["conductor"]
    _check_record(record, answer)
    assert record["trace_id"]  # serving.tracing is on in this project
    assert response.usage.total_tokens >= record["tokens"]
    assert response.system_fingerprint == "conductor/base"


def test_openai_client_stream_shows_only_the_answer_as_content(served):
    stream = _client(served).chat.completions.create(
        model="conductor",
        messages=[{"role": "user", "content": QUESTION}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"max_cost_usd": 0.5},
    )
    content, events, finals, usage = [], [], [], None
    for chunk in stream:
        extra = chunk.model_extra or {}
        if "conductor_event" in extra:
            events.append(extra["conductor_event"]["type"])
        if chunk.choices:
            content.append(chunk.choices[0].delta.content or "")
            if chunk.choices[0].finish_reason:
                finals.append((chunk.choices[0].finish_reason, extra["conductor"]))
        if chunk.usage:
            usage = chunk.usage
    answer = "".join(content)
    assert "5555" in answer
    assert events[:2] == ["conductor_output", "workflow"]
    assert events.index("step_started") < events.index("step_finished")
    ((reason, record),) = finals
    assert reason == "stop"
    _check_record(record, answer)
    assert record["budget"]["max_cost_usd"] == 0.5
    assert usage is not None and usage.total_tokens > 0


def test_a_question_the_sandbox_does_not_know_is_marked(served):
    """The sandbox-question example of docs/serving.md through the official client: the
    answer comes back, marked as made up by the simulated workers in the record and in a header."""
    raw = _client(served).chat.completions.with_raw_response.create(
        model="conductor", messages=[{"role": "user", "content": "What is 2+2?"}]
    )
    warning = raw.headers.get("x-conductor-warning")
    assert warning and "not one of the sandbox's prepared tasks" in warning
    assert "conductor ask --sample" in warning
    assert 'docs/sandbox.md, "Adding a real provider"' in warning
    record = raw.parse().model_extra["conductor"]
    assert record["simulated"] is True and record["sandbox_known_question"] is False
    assert record["warning"] == warning

    prepared = _client(served).chat.completions.with_raw_response.create(
        model="conductor", messages=[{"role": "user", "content": QUESTION}]
    )
    assert "x-conductor-warning" not in prepared.headers
    record = prepared.parse().model_extra["conductor"]
    # known to the sandbox, and still answered by its simulated workers
    assert record["workers"] and all(w.startswith("sim-") for w in record["workers"])
    assert record["simulated"] is True and record["sandbox_known_question"] is True
    assert record["warning"] is None


def test_litellm_uses_it_as_an_openai_provider(served):
    async def run():
        plain = await litellm.acompletion(
            model="openai/conductor",
            api_base=served.base_url,
            api_key=API_KEY,
            messages=[{"role": "user", "content": QUESTION}],
            num_retries=0,
        )
        streamed = await litellm.acompletion(
            model="openai/conductor",
            api_base=served.base_url,
            api_key=API_KEY,
            messages=[{"role": "user", "content": QUESTION}],
            stream=True,
            num_retries=0,
        )
        parts = [chunk.choices[0].delta.content or "" async for chunk in streamed]
        return plain, "".join(parts)

    plain, streamed_answer = asyncio.run(run())
    answer = plain.choices[0].message.content
    assert "5555" in answer and streamed_answer == answer
    record = getattr(plain, "conductor", None) or plain.model_extra.get("conductor")
    assert record is not None, "litellm dropped the conductor field"
    _check_record(record, answer)


def test_models_health_and_ready(served):
    models = _client(served).models.list()
    ids = [m.id for m in models.data]
    assert ids == ["conductor", "conductor/base"]
    assert httpx.get(f"{served.url}/health").json() == {"status": "ok", "model": "conductor/base"}
    ready = httpx.get(f"{served.url}/ready")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready" and body["endpoints"]["reachable"] == 1
    assert "127.0.0.1" not in ready.text  # endpoint addresses stay inside


def test_auth_errors_and_the_server_keeps_serving(served):
    with pytest.raises(openai.AuthenticationError, match="invalid API key"):
        _client(served, key="wrong").chat.completions.create(
            model="conductor", messages=[{"role": "user", "content": QUESTION}]
        )
    missing = httpx.post(
        f"{served.base_url}/chat/completions",
        json={"model": "conductor", "messages": [{"role": "user", "content": QUESTION}]},
    )
    assert (
        missing.status_code == 401 and "Authorization: Bearer" in missing.json()["error"]["message"]
    )
    headers = {"Authorization": f"Bearer {API_KEY}"}
    bad_json = httpx.post(
        f"{served.base_url}/chat/completions",
        content=b"{not json",
        headers={**headers, "content-type": "application/json"},
    )
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="no messages"):
        _client(served).chat.completions.create(model="conductor", messages=[])
    with pytest.raises(openai.BadRequestError, match="a zero budget"):
        _client(served).chat.completions.create(
            model="conductor",
            messages=[{"role": "user", "content": QUESTION}],
            extra_body={"max_cost_usd": 0},
        )
    with pytest.raises(openai.BadRequestError, match="serving.max_question_chars"):
        _client(served).chat.completions.create(
            model="conductor", messages=[{"role": "user", "content": "x" * 9000}]
        )
    with pytest.raises(openai.NotFoundError, match="not served here"):
        _client(served).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": QUESTION}]
        )
    # still serving
    ok = _client(served).chat.completions.create(
        model="conductor/base", messages=[{"role": "user", "content": QUESTION}]
    )
    assert "5555" in ok.choices[0].message.content


def test_logs_are_json_lines_without_secrets(served):
    with pytest.raises(openai.AuthenticationError):
        _client(served, key="sk-wrong-key-0123456789").models.list()
    _client(served).chat.completions.create(
        model="conductor", messages=[{"role": "user", "content": QUESTION}]
    )
    time.sleep(0.3)
    output = served.output
    assert API_KEY not in output and "sk-wrong-key-0123456789" not in output
    assert "Bearer" not in output
    access = []
    for line in output.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("event") == "request":
                access.append(entry)
    completions = [e for e in access if e["path"] == "/v1/chat/completions" and e["status"] == 200]
    assert completions, output[-2000:]
    last = completions[-1]
    assert {"request_id", "status", "latency_s", "cost_usd", "steps", "model_version"} <= set(last)
    assert last["steps"] == 1 and last["model_version"] == "conductor/base"
    assert any(e["status"] == 401 and e["error_code"] == "invalid_api_key" for e in access)


def test_explicit_missing_alias_fails_at_start_up(tmp_path):
    project = make_project(tmp_path / "project")
    process = ServeProcess(project, ["--model", "conductor@champion"], serve_env(tmp_path))
    with pytest.raises(RuntimeError, match="exited early") as info:
        process.start(timeout_s=120)
    message = str(info.value)
    assert "conductor@champion" in message and "does not resolve" in message
    assert process.process.returncode == 2


def test_sigterm_lets_the_request_in_flight_finish(tmp_path):
    # sim-sage with its simulated latency (about 2 s) and no cache: a request that takes a while
    project = make_project(
        tmp_path / "project",
        policy={"kind": "scripted", "worker": 0, "adapter": None},
        sandbox={"latency_scale": 1.0},
        cache_mode="off",
    )
    process = ServeProcess(project, ["--max-concurrency", "1"], serve_env(tmp_path)).start()
    outcome: dict = {}

    def ask() -> None:
        try:
            outcome["response"] = httpx.post(
                f"{process.base_url}/chat/completions",
                json={"model": "conductor", "messages": [{"role": "user", "content": QUESTION}]},
                timeout=60,
            )
        except Exception as exc:  # reported below
            outcome["error"] = exc

    try:
        worker = threading.Thread(target=ask)
        worker.start()
        deadline = time.monotonic() + 30
        while httpx.get(f"{process.url}/ready").json()["in_flight"] < 1:
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.02)
        # saturated: a second request is refused at once, with Retry-After
        started = time.monotonic()
        busy = httpx.post(
            f"{process.base_url}/chat/completions",
            json={"model": "conductor", "messages": [{"role": "user", "content": QUESTION}]},
            timeout=10,
        )
        assert busy.status_code == 429 and time.monotonic() - started < 1.0
        assert busy.headers["retry-after"] == "1" and "busy" in busy.json()["error"]["message"]
        sandbox = _children(process.process.pid)
        assert sandbox, "the sandbox subprocess was not found"
        process.terminate()
        worker.join(timeout=60)
        # a supervisor that repeats SIGTERM while the server stops its pool must not cut the
        # shutdown short (the sandbox would outlive it and the exit code would be -15)
        code = process.terminate_until_exit()
    finally:
        process.stop()
    assert "error" not in outcome, outcome.get("error")
    response = outcome["response"]
    assert response.status_code == 200, response.text
    assert "5555" in response.json()["choices"][0]["message"]["content"]
    assert code == 0, process.output[-3000:]
    assert "Shutting down" in process.output
    assert not any(_alive(pid) for pid in sandbox), "the sandbox outlived conductor serve"
