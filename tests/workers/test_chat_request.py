"""The OpenAI chat request both servers read (``workers.chat_request``): bodies no parser
should accept are refused with the field named, and the sandbox pool server answers them
with a 400 instead of an internal error."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from conductor_pipeline.tasks import Task
from conductor_pipeline.workers.chat_request import (
    MAX_JSON_DEPTH,
    ChatRequest,
    RequestError,
    load_json_body,
    validate_request,
)
from conductor_pipeline.workers.sandbox.profiles import default_profiles_path, load_profiles

ASK = {"model": "sim-sage", "messages": [{"role": "user", "content": "What is 2 + 2?"}]}


def _refusal(raw: bytes) -> RequestError:
    with pytest.raises(RequestError) as caught:
        load_json_body(raw)
    return caught.value


def test_nesting_is_bounded_at_any_depth_without_recursion():
    at_limit = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert load_json_body(at_limit) == json.loads(at_limit)
    for depth in (MAX_JSON_DEPTH + 1, 5_000, 200_000):
        error = _refusal(b"[" * depth + b"]" * depth)
        assert error.code == "json_too_deep" and f"deeper than {MAX_JSON_DEPTH}" in error.message
    inside = _refusal(b'{"tools": ' + b"[" * 100 + b"]" * 100 + b"}")
    assert inside.param == "tools"


@pytest.mark.parametrize(
    ("raw", "param", "phrase"),
    [
        (b'{"max_cost_usd": NaN}', "max_cost_usd", "NaN is not a finite number"),
        (b'{"a": {"b": [1, -Infinity]}}', "a.b.1", "-Infinity"),
        (b'{"a": 1e400}', "a", "Infinity"),
        (b'{"a": "\\udc00"}', "a", "unpaired UTF-16 surrogate"),
        (b'{"\\ud800": 1}', None, "unpaired UTF-16 surrogate"),
        (b'{"a": ' + b"7" * 4400 + b"}", None, "over 4300 digits"),
        (b'{"a": ', None, "not valid JSON"),
        (b"\xff\xfe\x00", None, "not valid JSON"),
    ],
)
def test_what_json_does_not_allow_is_refused_with_its_place(raw, param, phrase):
    error = _refusal(raw)
    assert phrase in error.message and error.param == param


@pytest.mark.parametrize(
    ("field", "value", "phrase"),
    [
        ("stream", "yes", 'valid boolean (got a string, "yes")'),
        ("stream", 0, "valid boolean (got an integer, 0)"),
        ("n", "1", "valid integer"),
        ("n", 1.0, "valid integer (got a number, 1.0)"),
        ("seed", True, "valid integer (got a boolean, true)"),
        ("seed", 2**64, "from -9223372036854775808 to 9223372036854775807"),
        ("max_tokens", [3], "valid integer (got an array)"),
        ("model", 7, "valid string"),
    ],
)
def test_field_types_are_strict(field, value, phrase):
    with pytest.raises(RequestError) as caught:
        validate_request({**ASK, field: value}, ChatRequest)
    assert phrase in caught.value.message and caught.value.param == field


def test_plain_requests_and_extra_fields_pass():
    body = validate_request(
        {**ASK, "seed": -(2**63), "n": 1, "stream": False, "tools": [], "user": "x"}, ChatRequest
    )
    assert body.seed == -(2**63) and body.model_extra == {"tools": [], "user": "x"}
    with pytest.raises(RequestError, match="JSON object"):
        validate_request([ASK], ChatRequest)


@pytest.fixture
async def sandbox():
    from conductor_pipeline.workers.sandbox.server import create_app

    tasks = [Task("t/1", "math", "easy", "What is 2 + 2?", "4", "number", "numeric", "unit")]
    profiles = load_profiles(default_profiles_path())
    app = create_app(profiles, tasks, latency_scale=0.0, load_real_model=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sandbox") as http:
        yield http


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b"[" * 50_000 + b"]" * 50_000, None),
        (json.dumps({**ASK, "temperature": math.nan}).encode(), "temperature"),
        (json.dumps({**ASK, "seed": 2**70}).encode(), "seed"),
        (json.dumps({**ASK, "max_tokens": "5"}).encode(), "max_tokens"),
        (json.dumps({**ASK, "stream": "no"}).encode(), "stream"),
        (json.dumps({**ASK, "n": 0}).encode(), "n"),
    ],
)
async def test_the_sandbox_server_answers_400_naming_the_field(sandbox, raw, param):
    response = await sandbox.post("/v1/chat/completions", content=raw)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert (await sandbox.post("/v1/chat/completions", json=ASK)).status_code == 200


async def test_the_sandbox_question_check_refuses_deep_json(sandbox):
    from conductor_pipeline.workers.sandbox.questions import RECOGNISE_PATH

    response = await sandbox.post(RECOGNISE_PATH, content=b"[" * 50_000 + b"]" * 50_000)
    assert response.status_code == 400 and "deeper than" in response.json()["error"]["message"]
