"""The usage log of a ``WorkerPool``: one ``UsageRecord`` per call, whatever its outcome,
and the per-worker summary of the records kept."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["UsageRecord", "usage_summary"]


@dataclass
class UsageRecord:
    """One line of the usage log: one call, whatever its outcome."""

    worker: str
    served_by: str | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    latency_s: float
    cache_hit: bool
    failure: str | None
    attempts: int
    timestamp: float
    sample_index: int = 0
    cost_source: str = "none"  # config | litellm | unknown | cache | none
    error: str | None = None


def usage_summary(
    names: Sequence[str], records: Iterable[UsageRecord]
) -> dict[str, dict[str, Any]]:
    """Per requested worker (``names``), over ``records``: calls, outcomes, tokens, dollars,
    latency, attempts."""
    kept = list(records)
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        rows = [r for r in kept if r.worker == name]
        failures: dict[str, int] = {}
        for r in rows:
            if r.failure:
                failures[r.failure] = failures.get(r.failure, 0) + 1
        latencies = [r.latency_s for r in rows if not r.cache_hit]
        out[name] = {
            "calls": len(rows),
            "ok": sum(1 for r in rows if r.failure is None),
            "failures": failures,
            "cache_hits": sum(1 for r in rows if r.cache_hit),
            "fallback_served": sum(1 for r in rows if r.served_by),
            "attempts": sum(r.attempts for r in rows),
            "prompt_tokens": sum(r.prompt_tokens for r in rows),
            "completion_tokens": sum(r.completion_tokens for r in rows),
            "cost_usd": sum(r.cost_usd for r in rows),
            "latency_p50_s": statistics.median(latencies) if latencies else 0.0,
            "latency_mean_s": statistics.fmean(latencies) if latencies else 0.0,
        }
    return out
