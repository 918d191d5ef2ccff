"""Benchmarks behind ``make bench``: each measures one figure set and returns it as a dict.

Speed is measured here, never asserted in tests. Results are merged into
``data/08_reporting/benchmarks.json`` with the machine they ran on.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

Benchmark = Callable[[], dict[str, Any]]
REGISTRY: dict[str, Benchmark] = {}


def benchmark(name: str) -> Callable[[Benchmark], Benchmark]:
    def register(fn: Benchmark) -> Benchmark:
        REGISTRY[name] = fn
        return fn

    return register


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def timings_summary(seconds: list[float]) -> dict[str, float]:
    return {
        "n": len(seconds),
        "median_ms": statistics.median(seconds) * 1000,
        "p95_ms": percentile(seconds, 95) * 1000,
        "mean_ms": statistics.fmean(seconds) * 1000,
    }


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def bench_tasks(folder, tasks: list | None = None) -> list:
    """Write ``tasks`` (default: two prepared tasks) for the sandbox to recognise, so that
    the benchmarks do not need data_prep; returns the ``tasks_paths`` list."""
    import pandas as pd

    from conductor_pipeline.tasks import Task

    tasks = tasks or [
        Task(
            "bench/add",
            "math",
            "easy",
            "Compute the sum of 1234 and 4321.",
            "5555",
            "number",
            "numeric",
            "bench",
        ),
        Task(
            "bench/syl",
            "logic",
            "easy",
            "All cats are mammals. Are cats mammals? Yes or No.",
            "Yes",
            "text",
            "exact",
            "bench",
        ),
    ]
    path = folder / "tasks.parquet"
    pd.DataFrame([t.to_record() for t in tasks]).to_parquet(path)
    return [path]
