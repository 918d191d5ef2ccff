"""WorkerPool against a real local OpenAI-compatible server, reached through litellm."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from conductor_pipeline.workers import (
    READ_ONLY_MISS,
    FailureKind,
    ResponseCache,
    WorkerCaller,
    WorkerPool,
)
from conductor_pipeline.workers.pricing import token_prices
from conductor_pipeline.workers.responses import reply_content

from .conftest import worker_entry
from .fake_openai_server import reply_text

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _pool(server, *entries, credentials=None, **kwargs) -> WorkerPool:
    return WorkerPool.from_config({"workers": list(entries)}, credentials, **kwargs)


async def test_reply_tokens_and_configured_prices(fake_server):
    pool = _pool(
        fake_server,
        worker_entry(fake_server, "sim-a", input_cost_per_token=1e-6, output_cost_per_token=3e-6),
        worker_entry(fake_server, "sim-b"),
    )
    caller: WorkerCaller = pool  # the pool is what the workflow executor needs
    assert pool.names == ["sim-a", "sim-b"] and len(pool) == 2
    assert pool.descriptions == ["test worker sim-a", "test worker sim-b"]
    reply = await caller(0, QUESTION)
    assert reply.ok and reply.text == reply_text("sim-a", QUESTION)
    assert reply.worker == "sim-a" and reply.served_by is None and reply.attempts == 1
    # the server counts words + 3 for the prompt, words for the completion
    assert reply.usage.prompt_tokens == 6 + 3
    assert reply.usage.completion_tokens == 3
    assert reply.usage.cost_usd == pytest.approx(9 * 1e-6 + 3 * 3e-6)
    assert reply.usage.latency_s > 0 and not reply.usage.cache_hit
    by_name = await pool.call("sim-b", QUESTION)
    assert by_name.ok and by_name.worker == "sim-b"
    assert pool.usage_log[-1].cost_source == "unknown" and by_name.usage.cost_usd == 0
    with pytest.raises(IndexError):
        await pool(2, QUESTION)
    await pool.aclose()


async def test_litellm_price_map_and_missing_usage(fake_server):
    pool = _pool(fake_server, worker_entry(fake_server, "gpt-4o-mini"))
    reply = await pool(0, QUESTION)
    assert reply.ok and reply.usage.cost_usd > 0
    assert pool.usage_log[-1].cost_source == "litellm"
    fake_server.set_mode("gpt-4o-mini", "nousage")
    reply = await pool(0, [{"role": "user", "content": "count my tokens please"}])
    assert reply.ok and reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    await pool.aclose()


async def test_a_live_call_costs_its_tokens_at_the_pricing_rules_prices(fake_server):
    """Configured and LiteLLM-mapped workers alike: a live call's cost is its token counts at
    the prices ``token_prices`` gives, the rule training and evaluation price calls by."""
    pool = _pool(
        fake_server,
        worker_entry(fake_server, "sim-a", input_cost_per_token=2e-6, output_cost_per_token=5e-6),
        worker_entry(fake_server, "gpt-4o-mini"),
    )
    for index, spec in enumerate(pool.specs):
        reply = await pool(index, QUESTION)
        prompt_price, completion_price = token_prices(spec)
        expected = (
            reply.usage.prompt_tokens * prompt_price
            + reply.usage.completion_tokens * completion_price
        )
        assert reply.ok and reply.usage.cost_usd == pytest.approx(expected, rel=1e-9)
        assert expected > 0
    assert [r.cost_source for r in pool.usage_log] == ["config", "litellm"]
    await pool.aclose()


async def test_cache_hit_then_distinct_sample_index(fake_server, tmp_path):
    cache = ResponseCache(tmp_path / "cache.sqlite")
    pool = _pool(fake_server, worker_entry(fake_server, "sim-a"), cache=cache)
    first = await pool(0, QUESTION)
    second = await pool(0, QUESTION)
    assert fake_server.calls("sim-a") == 1
    assert second.text == first.text and second.usage.cache_hit
    assert second.usage.cost_usd == 0 and second.attempts == 0
    assert [r.cache_hit for r in pool.usage_log] == [False, True]
    third = await pool(0, QUESTION, sample_index=1)
    assert fake_server.calls("sim-a") == 2 and not third.usage.cache_hit
    await pool(0, QUESTION, temperature=0.9)  # other sampling params: another key
    assert fake_server.calls("sim-a") == 3
    assert cache.stats["writes"] == 3
    await pool.aclose()

    # replay: the same file read-only answers hits and never calls the server on a miss
    replay = _pool(
        fake_server,
        worker_entry(fake_server, "sim-a"),
        cache=ResponseCache(tmp_path / "cache.sqlite", mode="read_only"),
    )
    again = await replay(0, QUESTION, sample_index=1)
    assert again.ok and again.usage.cache_hit
    missing = await replay(0, [{"role": "user", "content": "never asked"}])
    assert missing.failure is FailureKind.PROVIDER_ERROR and missing.error == READ_ONLY_MISS
    assert missing.attempts == 0
    assert fake_server.calls("sim-a") == 3
    await replay.aclose()


async def test_failures_are_not_cached(fake_server, tmp_path):
    pool = _pool(fake_server, worker_entry(fake_server, "sim-a"), cache=tmp_path / "c.sqlite")
    fake_server.set_mode("sim-a", "empty", times=1)
    empty = await pool(0, QUESTION)
    assert empty.failure is FailureKind.EMPTY_REPLY and empty.text is None
    assert empty.usage.prompt_tokens > 0  # still paid for
    retry = await pool(0, QUESTION)
    assert retry.ok and not retry.usage.cache_hit and fake_server.calls("sim-a") == 2
    await pool.aclose()


async def test_timeout(fake_server):
    pool = _pool(fake_server, worker_entry(fake_server, "sim-a", timeout_s=0.3))
    fake_server.set_mode("sim-a", "sleep", sleep_s=1.0)
    reply = await pool(0, QUESTION)
    assert reply.failure is FailureKind.TIMEOUT and reply.text is None
    assert reply.attempts == 1 and 0.3 <= reply.usage.latency_s < 1.0
    await pool.aclose()


async def test_rate_limit_after_retries(fake_server):
    pool = _pool(fake_server, worker_entry(fake_server, "sim-a", num_retries=1))
    fake_server.set_mode("sim-a", "429")
    reply = await pool(0, QUESTION)
    assert reply.failure is FailureKind.RATE_LIMIT
    assert reply.attempts == 2 and fake_server.calls("sim-a") == 2
    assert "rate limit" in reply.error
    # a single 429 is absorbed by the retry
    fake_server.set_mode("sim-a", "429", times=1)
    recovered = await pool(0, [{"role": "user", "content": "again"}])
    assert recovered.ok and recovered.attempts == 2
    await pool.aclose()


async def test_memory_keeps_the_latest_calls_and_the_file_keeps_every_one(fake_server, tmp_path):
    # a server calls its workers without end: the in-memory log must not grow with it
    log_path = tmp_path / "usage.jsonl"
    pool = _pool(
        fake_server,
        worker_entry(fake_server, "sim-a"),
        worker_entry(fake_server, "sim-b"),
        usage_log_path=log_path,
        usage_log_keep=2,
    )
    for worker in (0, 1, 0):
        assert (await pool(worker, QUESTION)).ok
    assert [r.worker for r in pool.usage_log] == ["sim-b", "sim-a"]
    assert [json.loads(line)["worker"] for line in log_path.read_text().splitlines()] == [
        "sim-a",
        "sim-b",
        "sim-a",
    ]
    assert pool.summary()["sim-b"]["calls"] == 1
    await pool.aclose()


async def test_server_error_served_by_fallback(fake_server, tmp_path):
    log_path = tmp_path / "usage.jsonl"
    pool = _pool(
        fake_server,
        worker_entry(
            fake_server,
            "sim-a",
            fallbacks=["sim-b"],
            input_cost_per_token=1.0,
            output_cost_per_token=1.0,
        ),
        worker_entry(fake_server, "sim-b", input_cost_per_token=0.0, output_cost_per_token=0.0),
        usage_log_path=log_path,
    )
    fake_server.set_mode("sim-a", "500")
    reply = await pool(0, QUESTION)
    assert reply.ok and reply.worker == "sim-a" and reply.served_by == "sim-b"
    assert reply.text == reply_text("sim-b", QUESTION)
    assert reply.attempts == 2
    assert reply.usage.cost_usd == 0.0  # priced as the worker that answered
    record = pool.usage_log[-1]
    assert record.worker == "sim-a" and record.served_by == "sim-b" and record.attempts == 2
    logged = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert logged[-1]["served_by"] == "sim-b"
    summary = pool.summary()
    assert summary["sim-a"]["fallback_served"] == 1 and summary["sim-a"]["ok"] == 1
    # without a fallback the same outage is a provider error
    fake_server.set_mode("sim-b", "500")
    failed = await pool(1, QUESTION)
    assert failed.failure is FailureKind.PROVIDER_ERROR and failed.attempts == 1
    assert pool.summary()["sim-b"]["failures"] == {"provider_error": 1}
    await pool.aclose()


async def test_secrets_never_leak(fake_server, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    secret = "sk-test-7f3a9c1e5b-DO-NOT-LEAK"
    log_path = tmp_path / "usage.jsonl"
    pool = _pool(
        fake_server,
        worker_entry(fake_server, "sim-a", credentials_key="fake"),
        credentials={"fake": {"api_key": secret}},
        usage_log_path=log_path,
    )
    spec = pool.specs[0]
    assert secret not in repr(spec) and secret not in repr(pool)
    ok = await pool(0, QUESTION)
    assert ok.ok and fake_server.state.auth[-1] == f"Bearer {secret}"  # the key was used
    fake_server.set_mode("sim-a", "401echo")  # a provider that echoes the key in its error
    failed = await pool(0, [{"role": "user", "content": "leak?"}])
    assert failed.failure is FailureKind.PROVIDER_ERROR
    assert "Incorrect API key" in failed.error and "***" in failed.error
    assert secret not in failed.error
    assert all(secret not in json.dumps(r.__dict__) for r in pool.usage_log)
    assert secret not in repr(failed) and secret not in json.dumps(failed.to_record())
    assert secret not in log_path.read_text()
    assert secret not in caplog.text
    await pool.aclose()


def test_reply_content_is_classified():
    def response(content):
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=content))])

    assert reply_content(response("Paris")) == ("Paris", None, None)
    assert reply_content(response(" \n "))[1] is FailureKind.EMPTY_REPLY
    assert reply_content(response(None))[1] is FailureKind.EMPTY_REPLY
    assert reply_content(response([{"type": "text"}]))[1] is FailureKind.MALFORMED_REPLY
    assert reply_content(SimpleNamespace(choices=[]))[1] is FailureKind.MALFORMED_REPLY


async def test_per_call_timeout_is_not_part_of_the_cache_key(fake_server, tmp_path):
    pool = _pool(fake_server, worker_entry(fake_server, "sim-a"), cache=tmp_path / "c.sqlite")
    await pool(0, QUESTION)
    hit = await pool(0, QUESTION, timeout=3)
    assert hit.usage.cache_hit and fake_server.calls("sim-a") == 1
    await pool.aclose()


def test_loopback_guard_is_active():
    import socket

    with socket.socket() as sock, pytest.raises(ConnectionRefusedError, match="loopback only"):
        sock.connect(("203.0.113.7", 443))
