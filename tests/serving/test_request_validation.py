"""No request body makes the Conductor API answer 5xx: deep nesting, non-finite numbers,
out-of-range integers and wrong field types are 400s naming the field; the bearer scheme is
case-insensitive; a non-finite number inside a result never reaches the wire. Checked
case by case, through ``conductor serve``, and with generated bodies (Hypothesis)."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conductor_pipeline.serving.server import BackgroundServer
from conductor_pipeline.workers.types import Usage, WorkerReply
from tests.serving.conftest import API_KEY, QUESTION
from tests.serving.test_app import KEY, FakePool, ask, make_service

HEADERS = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}


def _strict_json(text: str) -> Any:
    """Parse as standard JSON: NaN and Infinity are refused, as any strict client does."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _error(response: httpx.Response) -> dict[str, Any]:
    body = _strict_json(response.text)
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


@pytest.fixture(scope="module")
def server():
    with BackgroundServer(make_service()) as running:
        running.wait_ready()
        yield running


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.base_url, headers=HEADERS, timeout=30) as http:
        yield http


def _raw(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()  # allow_nan: NaN and Infinity go out as bare words


# (raw body, param named, words in the message)
SECTION_2 = [
    (b"[" * 100_000 + b"]" * 100_000, None, "nests deeper than 64"),
    (b'{"model": "conductor", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}", None, "nests"),
    (_raw(ask(max_cost_usd=math.nan)), "max_cost_usd", "NaN is not a finite number"),
    (_raw(ask(max_cost_usd=math.inf)), "max_cost_usd", "Infinity is not a finite number"),
    (_raw(ask(max_cost_usd=-math.inf, stream=True)), "max_cost_usd", "not a finite number"),
    (_raw(ask())[:-1] + b', "max_cost_usd": 1e999}', "max_cost_usd", "Infinity"),
    (_raw(ask(seed=2**70)), "seed", "from -9223372036854775808 to 9223372036854775807"),
    (_raw(ask(seed=-(2**63) - 1)), "seed", "signed 64 bits"),
    (_raw(ask(n=0)), "n", "send n=1"),
    (_raw(ask(n=True)), "n", "valid integer"),
    (_raw(ask(stream="yes")), "stream", 'valid boolean (got a string, "yes")'),
    (_raw(ask(stream=1)), "stream", "valid boolean (got an integer"),
    (_raw(ask(max_steps="3")), "max_steps", 'valid integer (got a string, "3")'),
    (_raw(ask(max_steps=2.0)), "max_steps", "valid integer (got a number"),
    (_raw(ask(max_rounds=False)), "max_rounds", "valid integer (got a boolean"),
    (_raw(ask(max_tokens="9")), "max_tokens", "valid integer"),
    (_raw(ask(max_cost_usd="0.1")), "max_cost_usd", "valid number"),
    (_raw(ask(stream_options={"include_usage": "yes"})), "stream_options.include_usage", ""),
    (_raw(ask(seed=1)).replace(b"1}", b"1" * 5000 + b"}"), None, "over 4300 digits"),
    (_raw(ask("\ud800 half a pair")), "messages.0.content", "unpaired UTF-16 surrogate"),
    (_raw({**ask(), "tools": [{"x": math.nan}]}), "tools.0.x", "NaN"),
]


@pytest.mark.parametrize(("raw", "param", "phrase"), SECTION_2)
def test_each_bad_body_is_a_400_naming_the_field(client, raw, param, phrase):
    response = client.post("/chat/completions", content=raw)
    assert response.status_code == 400, response.text
    error = _error(response)
    assert phrase in error["message"] and error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert client.post("/chat/completions", content=_raw(ask())).status_code == 200


def test_a_lower_case_bearer_scheme_is_accepted(server):
    for header in (f"bearer {KEY}", f"BEARER  {KEY}", f"bEaReR {KEY}"):
        response = httpx.post(
            f"{server.base_url}/chat/completions", json=ask(), headers={"Authorization": header}
        )
        assert response.status_code == 200, (header, response.text)
    for header in (f"Basic {KEY}", KEY, f"bearer{KEY}", f"bearer {KEY}x"):
        response = httpx.post(
            f"{server.base_url}/chat/completions", json=ask(), headers={"Authorization": header}
        )
        assert response.status_code == 401, header


class NanCostPool(FakePool):
    """A worker whose reported cost is NaN (a price nobody could compute)."""

    async def __call__(self, worker, messages, sample_index=0):
        reply = await super().__call__(worker, messages, sample_index)
        return WorkerReply(
            reply.worker,
            reply.text,
            Usage(prompt_tokens=10, completion_tokens=5, cost_usd=math.nan),
        )


def test_a_non_finite_number_in_a_result_is_written_as_null():
    with BackgroundServer(make_service(pool=NanCostPool())) as server:
        server.wait_ready()
        plain = httpx.post(f"{server.base_url}/chat/completions", json=ask(), headers=HEADERS)
        assert plain.status_code == 200, plain.text
        record = _strict_json(plain.text)["conductor"]
        assert record["cost_usd"] is None and record["steps"][0]["cost_usd"] is None
        streamed = httpx.post(
            f"{server.base_url}/chat/completions", json=ask(stream=True), headers=HEADERS
        )
        events = [
            line.removeprefix("data: ")
            for line in streamed.text.splitlines()
            if line.startswith("data: ")
        ]
        assert events[-1] == "[DONE]"
        chunks = [_strict_json(event) for event in events[:-1]]  # every chunk strict JSON
        assert chunks[-1]["conductor"]["cost_usd"] is None


def test_through_conductor_serve(served):
    """The same refusals from the real ``conductor serve`` (sandbox, scripted policy)."""
    base = {"model": "conductor", "messages": [{"role": "user", "content": QUESTION}]}
    headers = {"Authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    bodies = {
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "max_cost_usd": _raw({**base, "max_cost_usd": math.nan}),
        "seed": _raw({**base, "seed": 2**70}),
        "n": _raw({**base, "n": 0}),
        "stream": _raw({**base, "stream": "yes"}),
        "max_steps": _raw({**base, "max_steps": "3"}),
    }
    with httpx.Client(base_url=served.base_url, headers=headers, timeout=60) as http:
        for name, raw in bodies.items():
            response = http.post("/chat/completions", content=raw)
            assert response.status_code == 400, (name, response.text)
            assert _error(response)["param"] == (None if name == "deep" else name)
        lower = {**headers, "Authorization": f"bearer {API_KEY}"}
        answered = http.post("/chat/completions", content=_raw(base), headers=lower)
        assert answered.status_code == 200, answered.text


# --- generated bodies ---------------------------------------------------------------------

_ODD_TEXT = st.sampled_from(["", " ", "\ud800", "a\udfffb", "\x00", "é", "[", "}", "NaN"])
_TEXT = st.one_of(st.text(max_size=20), _ODD_TEXT)
_NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=2**62, max_value=2**80),
    st.integers(max_value=-(2**62)),
    st.floats(),  # NaN, ±Infinity, -0.0, subnormals
    st.sampled_from([0, 1, -1, 0.5, 1e308, 2**63, -(2**63)]),
)
_SCALARS = st.one_of(st.none(), st.booleans(), _NUMBERS, _TEXT)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=12,
)
_ROLES = st.one_of(st.sampled_from(["user", "system", "assistant", "tool", "wizard"]), _JSON)
_CONTENT = st.one_of(
    _TEXT,
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _JSON}), max_size=2),
    _JSON,
)
_MESSAGE = st.one_of(st.fixed_dictionaries({"role": _ROLES, "content": _CONTENT}), _JSON)
_FIELDS = {
    "model": st.one_of(st.sampled_from(["conductor", "conductor/7", "gpt-4o"]), _JSON),
    "messages": st.one_of(st.lists(_MESSAGE, min_size=1, max_size=3), _JSON),
    "stream": st.one_of(st.booleans(), _JSON),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": _JSON}), _JSON),
    "n": _JSON,
    "seed": st.one_of(_NUMBERS, _JSON),
    "max_tokens": st.one_of(_NUMBERS, _JSON),
    "max_completion_tokens": _JSON,
    "max_cost_usd": st.one_of(_NUMBERS, _JSON),
    "max_steps": st.one_of(st.integers(-3, 12), _JSON),
    "max_rounds": st.one_of(st.integers(-3, 3), _JSON),
    "temperature": _JSON,
}


@st.composite
def _bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["request", "request", "request", "json", "deep", "bytes"]))
    if kind == "json":
        return json.dumps(draw(_JSON)).encode()
    if kind == "deep":
        depth = draw(st.integers(1, 20_000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        return (opener * depth + "1" + closer * depth).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    body = {"model": "conductor", "messages": [{"role": "user", "content": "What is 6 times 7?"}]}
    for name, values in _FIELDS.items():
        choice = draw(st.sampled_from(["keep", "drop", "set"]))
        if choice == "drop":
            body.pop(name, None)
        elif choice == "set":
            body[name] = draw(values)
    return json.dumps(body).encode()


def test_a_question_beyond_the_basic_plane_is_answered(client):
    # found by the property below: the scripted Conductor writes its subtask as
    # JSON, U+10000 as a surrogate pair, which the workflow parser read as two lone halves
    raw = b'{"model": "conductor", "messages": [{"role": "user", "content": "a\\ud800\\udc00b"}]}'
    response = client.post("/chat/completions", content=raw)
    assert response.status_code == 200, response.text
    assert "a\U00010000b" in response.json()["choices"][0]["message"]["content"]


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(raw=_bodies())
def test_no_generated_body_gets_a_5xx(client, raw):
    response = client.post("/chat/completions", content=raw)
    assert response.status_code < 500, (raw[:300], response.text)
    if response.status_code >= 400:
        error = _error(response)  # valid JSON with a message
        assert error["type"]
    elif response.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        for event in events[:-1]:
            _strict_json(event)
    else:
        assert _strict_json(response.text)["choices"][0]["message"]["content"] is not None
