"""Fault injection above the pool (FaultInjector) and below the Router (ProviderFaults)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from conductor_pipeline.workers import (
    FailureKind,
    FaultInjector,
    ProviderFaults,
    Usage,
    WorkerPool,
    WorkerReply,
)

from .conftest import worker_entry

MIXED_20 = {"timeout": 0.05, "rate_limit": 0.05, "provider_error": 0.05, "empty_reply": 0.05}


class _EchoCaller:
    names = ["alpha", "beta"]

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, worker, messages, sample_index=0, **overrides):
        self.calls += 1
        return WorkerReply(worker=self.names[worker], text="ok", usage=Usage(prompt_tokens=1))


def _questions(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"question {i}"}] for i in range(n)]


async def _outcomes(injector, n=400):
    replies = [await injector(i % 2, q) for i, q in enumerate(_questions(n))]
    return [r.failure for r in replies], replies


async def test_fault_injector_is_typed_seeded_and_close_to_its_rates():
    inner = _EchoCaller()
    injector = FaultInjector(inner, MIXED_20, seed=7, latency_s={"timeout": 30.0})
    kinds, replies = await _outcomes(injector)
    failed = [r for r in replies if not r.ok]
    assert 0.12 < len(failed) / len(replies) < 0.28
    assert inner.calls == injector.passed == len(replies) - len(failed)
    assert set(Counter(kinds)) == {None, *map(FailureKind, MIXED_20)}
    for reply in failed:
        assert reply.text is None and reply.error.startswith("injected ")
        assert reply.worker in _EchoCaller.names
        expected = 30.0 if reply.failure is FailureKind.TIMEOUT else 0.0
        assert reply.usage.latency_s == expected
    same, _ = await _outcomes(FaultInjector(_EchoCaller(), MIXED_20, seed=7))
    other, _ = await _outcomes(FaultInjector(_EchoCaller(), MIXED_20, seed=8))
    assert same == kinds and other != kinds
    with pytest.raises(ValueError, match="unknown failure kind"):
        FaultInjector(inner, {"gremlins": 0.1})
    with pytest.raises(ValueError, match="more than 1"):
        FaultInjector(inner, {"timeout": 0.6, "rate_limit": 0.6})
    with pytest.raises(ValueError, match="cannot inject"):
        ProviderFaults({"malformed_reply": 0.1})


async def test_200_calls_with_faults_above_and_below_the_router(fake_server, tmp_path):
    below = ProviderFaults(MIXED_20, seed=3)
    entries = [
        worker_entry(fake_server, "sim-a", num_retries=1, fallbacks=["sim-b"], max_concurrency=64),
        worker_entry(fake_server, "sim-b", num_retries=1, fallbacks=["sim-c"], max_concurrency=64),
        worker_entry(fake_server, "sim-c", num_retries=1, max_concurrency=64),
    ]
    pool = WorkerPool.from_config(
        {"workers": entries}, provider_faults=below, usage_log_path=tmp_path / "usage.jsonl"
    )
    above = FaultInjector(pool, MIXED_20, seed=3)
    questions = _questions(200)
    replies = await asyncio.wait_for(
        asyncio.gather(*(above(i % 3, q) for i, q in enumerate(questions))), timeout=45
    )

    # every call is accounted for: a reply with text, or a typed failure with a message
    assert len(replies) == 200
    for reply in replies:
        assert isinstance(reply, WorkerReply)
        assert (reply.text is not None) != (reply.failure is not None)
        if reply.failure is not None:
            assert isinstance(reply.failure, FailureKind) and reply.error
    injected_above = sum(above.injected.values())
    assert injected_above + above.passed == 200
    assert len(pool.usage_log) == above.passed
    assert len((tmp_path / "usage.jsonl").read_text().splitlines()) == above.passed

    # below the router: the Router really retried and fell back
    records = pool.usage_log
    assert sum(below.injected.values()) > 0
    assert any(r.attempts > 1 and r.failure is None and r.served_by is None for r in records)
    assert any(r.served_by in {"sim-b", "sim-c"} for r in records)
    assert any(r.failure == "empty_reply" for r in records)
    # each attempt the provider saw belongs to exactly one recorded call
    assert sum(r.attempts for r in records) == sum(below.attempts.values())
    summary = pool.summary()
    assert sum(s["calls"] for s in summary.values()) == above.passed
    ok = sum(1 for r in replies if r.ok)
    assert ok >= 150, Counter(r.failure for r in replies)
    await pool.aclose()
