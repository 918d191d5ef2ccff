"""The small benchmark suites (verifiers, worker pool, executor); each function is registered
under the name the report uses. Serving, training and the parser have modules of their own."""

from __future__ import annotations

import time
from typing import Any

from conductor_pipeline.benchmarks import (
    bench_tasks,
    benchmark,
    parsing,  # noqa: F401  (registers "parser")
    timed,
    timings_summary,
)


@benchmark("verifiers")
def verifier_throughput() -> dict[str, Any]:
    """Seconds to verify one answer, per verifier (code runs in the sandbox)."""
    from conductor_pipeline.tasks import Task, verify

    cases = {
        "math": (
            Task("b/m", "math", "easy", "1/2+1/4?", "\\frac{3}{4}", "math", "math", "bench"),
            "so \\boxed{3/4}",
        ),
        "multiple_choice": (
            Task(
                "b/c",
                "knowledge",
                "easy",
                "Pick one. A) x B) y",
                "B",
                "letter",
                "multiple_choice",
                "bench",
                {"choices": ["x", "y"]},
            ),
            "The answer is (B).",
        ),
        "numeric": (
            Task("b/n", "math", "easy", "2+2?", "4", "number", "numeric", "bench"),
            "It is 4.",
        ),
        "code": (
            Task(
                "b/code",
                "code",
                "easy",
                "Write add(a, b).",
                "def add(a, b):\n    return a + b\n",
                "code",
                "code",
                "bench",
                {
                    "prompt": "def add(a, b):\n",
                    "entry_point": "add",
                    "test": "def check(f):\n    assert f(1, 2) == 3\n",
                },
            ),
            "```python\ndef add(a, b):\n    return a + b\n```",
        ),
    }
    figures: dict[str, Any] = {}
    for name, (task, response) in cases.items():
        assert verify(task, response).correct, f"benchmark case {name} does not verify"
        figures[name] = timings_summary(
            timed(lambda t=task, r=response: verify(t, r), 5 if name == "code" else 50)
        )
    return figures


@benchmark("worker_pool")
def worker_pool_overhead() -> dict[str, Any]:
    """The pool's cost on top of the HTTP call: a zero-latency sandbox worker reached directly
    (raw HTTP) and through the pool (litellm Router, accounting, cache lookup), sequential
    latency, throughput at 64 concurrent calls, and the latency of a cache hit."""
    import asyncio
    import tempfile
    from pathlib import Path

    import httpx

    from conductor_pipeline.workers import ResponseCache, WorkerPool
    from conductor_pipeline.workers.sandbox import SandboxServer

    n_sequential, n_concurrent = 100, 256
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with SandboxServer(
            tasks_paths=bench_tasks(folder), latency_scale=0.0, load_real_model=False
        ) as server:
            entries = [e for e in server.pool_config() if e["name"] == "sim-sprout"]

            async def run() -> dict[str, Any]:
                messages = [{"role": "user", "content": "Compute the sum of 1234 and 4321."}]
                body = {"model": "sim-sprout", "messages": messages}
                async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
                    raw = []
                    for i in range(n_sequential):
                        start = time.perf_counter()
                        (
                            await client.post("/chat/completions", json={**body, "seed": i})
                        ).raise_for_status()
                        raw.append(time.perf_counter() - start)
                pool = WorkerPool.from_config({"workers": entries})
                pooled = []
                for i in range(n_sequential):
                    start = time.perf_counter()
                    reply = await pool(0, messages, sample_index=i)
                    pooled.append(time.perf_counter() - start)
                    assert reply.ok, reply.error
                start = time.perf_counter()
                replies = await asyncio.gather(
                    *(pool(0, messages, sample_index=10_000 + i) for i in range(n_concurrent))
                )
                concurrent_s = time.perf_counter() - start
                await pool.aclose()

                cached_pool = WorkerPool.from_config(
                    {"workers": entries}, cache=ResponseCache(folder / "c.sqlite")
                )
                await cached_pool(0, messages)
                hits = []
                for _ in range(n_sequential):
                    start = time.perf_counter()
                    reply = await cached_pool(0, messages)
                    hits.append(time.perf_counter() - start)
                    assert reply.usage.cache_hit
                await cached_pool.aclose()
                raw_summary, pooled_summary = timings_summary(raw), timings_summary(pooled)
                return {
                    "raw_http": raw_summary,
                    "through_pool": pooled_summary,
                    "pool_overhead_median_ms": pooled_summary["median_ms"]
                    - raw_summary["median_ms"],
                    "pool_overhead_p95_ms": pooled_summary["p95_ms"] - raw_summary["p95_ms"],
                    "concurrent_calls": n_concurrent,
                    "concurrency": 64,
                    "throughput_calls_per_s": n_concurrent / concurrent_s,
                    "concurrent_failures": sum(not r.ok for r in replies),
                    "cache_hit": timings_summary(hits),
                }

            # the sandbox workers' default concurrency limit is what caps the 64-way fan-out
            for entry in entries:
                entry["max_concurrency"] = 64
            return asyncio.run(run())


@benchmark("executor")
def executor_overhead() -> dict[str, Any]:
    """Executor cost per step on a zero-latency in-process pool, and for a 4-step tree with
    100 ms workers the ratio of wall time to the critical path (a sequential executor: 1.33)."""
    import asyncio

    from conductor_pipeline.workers.types import Usage, WorkerReply
    from conductor_pipeline.workflow import Step, Workflow, execute_workflow

    def caller(delay: float):
        async def call(worker, messages, sample_index=0):
            if delay:
                await asyncio.sleep(delay)
            return WorkerReply(
                worker=f"w{worker}", text="ok", usage=Usage(prompt_tokens=1, completion_tokens=1)
            )

        return call

    chain = Workflow([Step(i % 3, f"step {i}", tuple(range(i))) for i in range(5)])
    # steps 0 and 1 independent, 2 sees both, 3 sees 2: critical path 3 × 100 ms of 4 × 100 ms
    tree = Workflow([Step(0, "a", ()), Step(1, "b", ()), Step(2, "c", (0, 1)), Step(0, "d", (2,))])

    async def run() -> dict[str, Any]:
        zero = caller(0.0)
        for _ in range(20):  # warm-up
            await execute_workflow(chain, "q", zero)
        repeats = 400
        start = time.perf_counter()
        for _ in range(repeats):
            await execute_workflow(chain, "q", zero)
        per_step_ms = (time.perf_counter() - start) / (repeats * len(chain)) * 1000
        slow = caller(0.1)
        ratios = []
        for _ in range(5):
            result = await execute_workflow(tree, "q", slow)
            ratios.append(result.latency_s / 0.3)
        return {
            "overhead_per_step_ms": per_step_ms,
            "overhead_target_ms": 1.0,
            "tree_wall_over_critical_path": ratios,
            "tree_ratio_median": sorted(ratios)[len(ratios) // 2],
            "tree_ratio_target": 1.05,
            "sequential_executor_ratio": 4 / 3,
        }

    return asyncio.run(run())
