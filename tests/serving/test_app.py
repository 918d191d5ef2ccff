"""The Conductor API in process (uvicorn in a thread) over a fake worker pool: request
validation, budgets, context, concurrency, timeouts, streaming format, logs and traces."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import httpx
import mlflow
import openai
import pytest

from conductor_pipeline.serving.models import ServedModel
from conductor_pipeline.serving.schema import Message, compose_question
from conductor_pipeline.serving.server import BackgroundServer
from conductor_pipeline.serving.service import ConductorService
from conductor_pipeline.serving.settings import RequestLimits, ServingSettings
from conductor_pipeline.workers.types import Usage, WorkerReply
from conductor_pipeline.workflow import OrchestrationConfig, PolicyCompletion, PromptConfig
from conductor_pipeline.workflow.executor import Budget
from conductor_pipeline.workflow.policy import ScriptedPolicy

KEY = "sk-app-test-3f9a7c21"


class FakePool:
    """Echoes the subtask; optionally holds every call until ``release`` is set."""

    def __init__(self, delay_s: float = 0.0, hold: bool = False) -> None:
        self.delay_s = delay_s
        self.hold = hold
        self.release = threading.Event()
        self.calls: list[tuple[int, list[dict]]] = []

    async def __call__(self, worker, messages, sample_index=0):
        self.calls.append((worker, messages))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        while self.hold and not self.release.is_set():
            await asyncio.sleep(0.01)
        subtask = messages[-1]["content"].rsplit("Your subtask:\n", 1)[-1]
        return WorkerReply(
            f"w{worker}",
            f"answer to: {subtask}",
            Usage(prompt_tokens=10, completion_tokens=5, cost_usd=0.001, latency_s=self.delay_s),
        )


class TwoStepPolicy:
    """Two independent steps and a third that sees both."""

    name = "two-step"

    async def complete(self, messages, *, temperature, max_tokens, seed):
        text = (
            "model_id = [0, 1, 0]\nsubtasks = ['first', 'second', 'combine']\n"
            'access_list = [[], [], "all"]'
        )
        return PolicyCompletion(text, 100, 30, 0.0)


class SlowLoadingPolicy(ScriptedPolicy):
    def __init__(self) -> None:
        super().__init__(worker=0)
        self.loaded = threading.Event()

    def load(self) -> None:
        self.loaded.wait(30)


def make_service(
    policy=None, pool=None, *, api_key=KEY, tracer=None, worker_names=("alpha", "beta"), **settings
) -> ConductorService:
    return ConductorService(
        policy=policy or ScriptedPolicy(worker=1),
        call_worker=pool or FakePool(),
        descriptions=["generalist", "maths"],
        worker_names=list(worker_names),
        orchestration=OrchestrationConfig(
            prompt=PromptConfig(assistant_prefill="model_id = ["),
            budget=Budget(max_steps=5, max_tokens=None, max_cost_usd=None),
        ),
        served=ServedModel(version="7", registered_name="conductor", alias="champion", policy="t"),
        settings=ServingSettings(**settings),
        api_key=api_key,
        tracer=tracer,
    )


def post(server, body, key=KEY, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(
        f"{server.base_url}/chat/completions", json=body, headers=headers, timeout=30, **kwargs
    )


def ask(question="What is 6 times 7?", **extra) -> dict:
    return {"model": "conductor", "messages": [{"role": "user", "content": question}], **extra}


@pytest.fixture
def server():
    with BackgroundServer(make_service()) as running:
        running.wait_ready()
        yield running


def test_answer_record_and_version_ids(server):
    response = post(server, ask())
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["choices"][0]["message"]["content"] == "answer to: What is 6 times 7?"
    record = body["conductor"]
    assert record["model"]["id"] == "conductor/7" and record["model"]["alias"] == "champion"
    assert record["steps"][0]["worker_name"] == "beta"
    assert record["cost_usd"] == pytest.approx(0.001) and record["tokens"] == 15
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    assert response.headers["x-request-id"] == body["id"] == record["request_id"]
    for model in ("conductor/7", "conductor@champion"):
        assert post(server, {**ask(), "model": model}).status_code == 200
    models = httpx.get(f"{server.base_url}/models", headers={"Authorization": f"Bearer {KEY}"})
    assert [m["id"] for m in models.json()["data"]] == ["conductor", "conductor/7"]


@pytest.mark.parametrize(
    ("body", "status", "phrase"),
    [
        ({"model": "conductor"}, 400, "no messages"),
        ({"model": "conductor", "messages": []}, 400, "no messages"),
        ([1, 2], 400, "JSON object"),
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "model"),
        (
            {"model": "conductor", "messages": [{"role": "assistant", "content": "hi"}]},
            400,
            "last message must be the user's",
        ),
        ({"model": "conductor", "messages": [{"role": "user", "content": "  "}]}, 400, "empty"),
        (
            {"model": "conductor", "messages": [{"role": "wizard", "content": "hi"}]},
            400,
            "unknown role",
        ),
        (
            {
                "model": "conductor",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            },
            400,
            "only text content",
        ),
        (ask(n=2), 400, "n=1"),
        (ask(max_cost_usd=0), 400, "zero budget"),
        (ask(max_steps=0), 400, "zero budget"),
        (ask(max_tokens=0), 400, "zero budget"),
        (ask(max_cost_usd=-1), 400, "must be positive"),
        (ask(max_steps=11), 400, "serving.limits.max_steps"),
        (ask(max_rounds=3), 400, "serving.limits.max_rounds"),
        (ask(max_rounds=-1), 400, "max_rounds"),
        (ask("x" * 9000), 400, "serving.max_question_chars"),
        ({**ask(), "model": "gpt-4o"}, 404, "not served here"),
    ],
)
def test_bad_requests_say_why_and_the_server_keeps_serving(server, body, status, phrase):
    response = post(server, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert phrase in error["message"]
    assert error["type"]
    assert post(server, ask()).status_code == 200


def test_malformed_json_and_oversized_bodies(server):
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    bad = httpx.post(f"{server.base_url}/chat/completions", content=b'{"model": ', headers=headers)
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    huge = json.dumps(ask("y" * 300_000)).encode()
    too_big = httpx.post(f"{server.base_url}/chat/completions", content=huge, headers=headers)
    assert too_big.status_code == 413 and "serving.max_body_bytes" in too_big.text

    def chunked():  # no Content-Length: the limit is enforced while reading
        yield huge[:1000]
        yield huge[1000:]

    streamed = httpx.post(f"{server.base_url}/chat/completions", content=chunked(), headers=headers)
    assert streamed.status_code == 413
    assert post(server, ask()).status_code == 200


def test_auth_missing_and_wrong_tokens(server):
    missing = post(server, ask(), key=None)
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer" in missing.json()["error"]["message"]
    wrong = post(server, ask(), key="sk-nope")
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{server.base_url}/models").status_code == 401
    assert httpx.get(f"{server.url}/health").status_code == 200  # probes stay open


def test_no_key_configured_means_no_auth():
    with BackgroundServer(make_service(api_key=None)) as server:
        server.wait_ready()
        assert post(server, ask(), key=None).status_code == 200


def test_budgets_apply_per_request():
    pool = FakePool()
    with BackgroundServer(make_service(TwoStepPolicy(), pool)) as server:
        server.wait_ready()
        full = post(server, ask()).json()["conductor"]
        assert full["worker_calls"] == 3 and full["stopped_by"] is None
        capped = post(server, ask(max_steps=2)).json()
        record = capped["conductor"]
        assert record["worker_calls"] == 2 and record["stopped_by"] == "max_steps"
        assert record["budget"]["max_steps"] == 2
        assert capped["choices"][0]["message"]["content"].startswith("answer to:")
        by_cost = post(server, ask(max_cost_usd=0.0015)).json()["conductor"]
        assert (
            by_cost["stopped_by"] == "max_cost_usd" and by_cost["budget"]["max_cost_usd"] == 0.0015
        )
        by_tokens = post(server, ask(max_completion_tokens=20)).json()["conductor"]
        assert by_tokens["budget"]["max_tokens"] == 20


def test_earlier_turns_reach_the_conductor_as_context():
    pool = FakePool()
    with BackgroundServer(make_service(pool=pool)) as server:
        server.wait_ready()
        body = {
            "model": "conductor",
            "messages": [
                {"role": "system", "content": "Answer tersely."},
                {"role": "user", "content": "My number is 41."},
                {"role": "assistant", "content": "Noted:\n41."},
                {"role": "user", "content": "What is my number plus one?"},
            ],
        }
        assert post(server, body).status_code == 200
    subtask = pool.calls[-1][1][-1]["content"]
    assert "system: Answer tersely.\nuser: My number is 41.\nassistant: Noted: 41." in subtask
    assert subtask.rstrip().endswith("The question to answer now:\nWhat is my number plus one?")


def test_context_keeps_the_most_recent_turns():
    messages = [Message(role="user", content=f"turn {i} " + "z" * 50) for i in range(10)]
    messages.append(Message(role="user", content="last?"))
    question, turns = compose_question(messages, 100, 200)
    assert 0 < turns < 10 and "turn 9" in question and "turn 0" not in question
    assert question.endswith("last?")


def test_saturation_is_refused_at_once_with_retry_after():
    pool = FakePool(hold=True)
    with BackgroundServer(make_service(pool=pool, max_concurrency=2, retry_after_s=3)) as server:
        server.wait_ready()
        results: list[httpx.Response] = []
        threads = [
            threading.Thread(target=lambda: results.append(post(server, ask()))) for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while server.app.state.gate.active < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        started = time.monotonic()
        busy = post(server, ask())
        assert time.monotonic() - started < 1.0
        assert busy.status_code == 429 and busy.headers["retry-after"] == "3"
        assert "serving.max_concurrency" in busy.json()["error"]["message"]
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(
                base_url=server.base_url, api_key=KEY, max_retries=0
            ).chat.completions.create(**ask())
        pool.release.set()
        for thread in threads:
            thread.join(timeout=10)
        assert [r.status_code for r in results] == [200, 200]
        _wait_for_free_slots(server)
        assert post(server, ask()).status_code == 200


def test_timeout_is_a_504_and_frees_the_slot():
    pool = FakePool(hold=True)
    with BackgroundServer(
        make_service(pool=pool, request_timeout_s=0.5, max_concurrency=1)
    ) as server:
        server.wait_ready()
        response = post(server, ask())
        assert response.status_code == 504
        assert "serving.request_timeout_s" in response.json()["error"]["message"]
        pool.release.set()
        assert post(server, ask()).status_code == 200


def test_format_failure_is_a_502_with_the_record():
    class Babbler:
        name = "babbler"

        async def complete(self, messages, *, temperature, max_tokens, seed):
            return PolicyCompletion("I would rather chat.", 10, 5, 0.0)

    with BackgroundServer(make_service(Babbler())) as server:
        server.wait_ready()
        response = post(server, ask())
        assert response.status_code == 502
        body = response.json()
        assert body["error"]["code"] == "conductor_format_failure"
        assert (
            body["conductor"]["format_failure"] and len(body["conductor"]["conductor_calls"]) == 5
        )


def test_health_is_503_until_the_policy_has_loaded():
    policy = SlowLoadingPolicy()
    with BackgroundServer(make_service(policy)) as server:
        health = httpx.get(f"{server.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "loading"
        assert httpx.get(f"{server.url}/ready").status_code == 503
        loading = post(server, ask())
        assert loading.status_code == 503 and "still loading" in loading.text
        policy.loaded.set()
        server.wait_ready()
        assert httpx.get(f"{server.url}/ready").json()["status"] == "ready"


def _events(response: httpx.Response) -> list[str]:
    return [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]


def test_stream_format_chunk_by_chunk():
    with BackgroundServer(make_service(TwoStepPolicy())) as server:
        server.wait_ready()
        response = post(server, ask(stream=True, stream_options={"include_usage": True}))
    assert response.headers["content-type"].startswith("text/event-stream")
    data = _events(response)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    progress = [c for c in chunks if "conductor_event" in c]
    assert all(c["choices"][0]["delta"] == {} for c in progress)
    kinds = [c["conductor_event"]["type"] for c in progress]
    assert kinds[:2] == ["conductor_output", "workflow"]
    assert kinds.count("step_started") == 3 and kinds.count("step_finished") == 3
    contents = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert [c for c in contents if c] == ["answer to: combine"]
    final = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
    assert (
        final["choices"][0]["finish_reason"] == "stop" and final["conductor"]["worker_calls"] == 3
    )
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 175


def test_stream_errors_arrive_as_error_events():
    pool = FakePool(hold=True)
    with BackgroundServer(make_service(pool=pool, request_timeout_s=0.5)) as server:
        server.wait_ready()
        response = post(server, ask(stream=True))
        data = _events(response)
        assert data[-1] == "[DONE]"
        assert json.loads(data[-2])["error"]["code"] == "timeout"
        with pytest.raises(openai.APIError, match="serving.request_timeout_s"):
            client = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
            for _ in client.chat.completions.create(**ask(), stream=True):
                pass
        _wait_for_free_slots(server)


def _wait_for_free_slots(server) -> None:
    deadline = time.monotonic() + 10
    while server.app.state.gate.active:
        assert time.monotonic() < deadline, "a slot was never released"
        time.sleep(0.02)


def test_a_client_that_leaves_mid_stream_frees_its_slot():
    pool = FakePool(hold=True)
    with BackgroundServer(make_service(pool=pool, max_concurrency=1)) as server:
        server.wait_ready()
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.stream(
            "POST", f"{server.base_url}/chat/completions", json=ask(stream=True), headers=headers
        ) as response:
            next(response.iter_lines())  # the role chunk arrived; then hang up
        _wait_for_free_slots(server)
        pool.release.set()
        assert post(server, ask()).status_code == 200


def test_access_log_lines_carry_the_request_but_no_secret(server, caplog):
    caplog.set_level(logging.INFO, logger="conductor_pipeline.serving.access")
    post(server, ask())
    post(server, ask(), key="sk-not-the-key-12345")
    time.sleep(0.1)
    entries = [r.fields for r in caplog.records if hasattr(r, "fields")]
    ok = next(e for e in entries if e["status"] == 200)
    assert ok["steps"] == 1 and ok["cost_usd"] == pytest.approx(0.001)
    assert ok["model_version"] == "conductor/7" and ok["latency_s"] >= 0
    refused = next(e for e in entries if e["status"] == 401)
    assert refused["error_code"] == "invalid_api_key"
    text = json.dumps(entries) + caplog.text
    assert KEY not in text and "sk-not-the-key-12345" not in text


def test_each_request_is_traced_in_mlflow(tmp_path):
    from conductor_pipeline.serving.server import mlflow_tracer

    tracer = mlflow_tracer(tmp_path, "serving-test")
    with BackgroundServer(make_service(tracer=tracer)) as server:
        server.wait_ready()
        record = post(server, ask()).json()["conductor"]
    trace = mlflow.get_trace(record["trace_id"], flush=True)
    assert trace.info.tags["request_id"] == record["request_id"]
    assert trace.info.tags["model_version"] == "conductor/7"
    assert any(span.name.startswith("step 0") for span in trace.data.spans)


def test_request_limits_cap_the_defaults():
    service = make_service(limits=RequestLimits(max_steps=3, max_cost_usd=1.0, max_rounds=0))
    with BackgroundServer(service) as server:
        server.wait_ready()
        record = post(server, ask()).json()["conductor"]
    assert record["budget"] == {
        "max_steps": 3,
        "max_tokens": None,
        "max_cost_usd": 1.0,
        "max_rounds": 0,
    }


class SandboxLikePool(FakePool):
    """A pool whose sandbox knows only the questions in ``known`` (as ``open_worker_pool``
    attaches a check to a sandbox with simulated workers); the real check is tested over
    HTTP in tests/workers/test_sandbox_questions.py and tests/serving/test_serve.py."""

    def __init__(self, known: set[str], fail: bool = False) -> None:
        super().__init__()
        self.known, self.fail, self.checked = known, fail, []

    async def question_check(self, question: str):
        from conductor_pipeline.workers.sandbox import QuestionCheck

        self.checked.append(question)
        if self.fail:
            raise RuntimeError("sandbox gone")
        return QuestionCheck(known=question in self.known)


def test_an_unknown_question_is_marked_in_the_record_and_a_header():
    from conductor_pipeline.workers.sandbox import UNKNOWN_QUESTION_WARNING

    pool = SandboxLikePool(known={"What is 6 times 7?"})
    sandbox_names = ("sim-sage", "sim-abacus")
    with BackgroundServer(make_service(pool=pool, worker_names=sandbox_names)) as server:
        server.wait_ready()
        unknown = post(server, ask("What is 2+2?"))
        known = post(server, ask())
        streamed = post(server, ask("What is 2+2?", stream=True))
    assert pool.checked == ["What is 2+2?", "What is 6 times 7?", "What is 2+2?"]
    assert unknown.status_code == 200
    record = unknown.json()["conductor"]
    assert record["simulated"] is True and record["sandbox_known_question"] is False
    assert record["warning"] == UNKNOWN_QUESTION_WARNING
    assert unknown.headers["x-conductor-warning"] == UNKNOWN_QUESTION_WARNING
    record = known.json()["conductor"]
    # a prepared question, still answered by a simulated worker
    assert record["simulated"] is True and record["sandbox_known_question"] is True
    assert record["warning"] is None and "x-conductor-warning" not in known.headers
    assert streamed.headers["x-conductor-warning"] == UNKNOWN_QUESTION_WARNING
    final = next(
        json.loads(d)
        for d in _events(streamed)[:-1]
        if json.loads(d)["choices"] and json.loads(d)["choices"][0]["finish_reason"]
    )
    assert final["conductor"]["simulated"] is True
    assert final["conductor"]["warning"] == UNKNOWN_QUESTION_WARNING


def test_real_workers_get_no_mark_and_a_failed_check_fails_no_request(server):
    response = post(server, ask())  # FakePool: no question_check, as a real-provider pool
    record = response.json()["conductor"]
    assert (record["simulated"], record["sandbox_known_question"], record["warning"]) == (
        False,
        None,
        None,
    )
    assert "x-conductor-warning" not in response.headers
    with BackgroundServer(make_service(pool=SandboxLikePool(set(), fail=True))) as failing:
        failing.wait_ready()
        response = post(failing, ask())
    assert response.status_code == 200 and response.json()["conductor"]["warning"] is None
