"""The benchmark suites; each function is registered under the name the report uses."""

from __future__ import annotations

import time
from typing import Any

from conductor_pipeline.benchmarks import benchmark, timed, timings_summary


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


def _bench_tasks(folder, tasks: list | None = None) -> list:
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
            tasks_paths=_bench_tasks(folder), latency_scale=0.0, load_real_model=False
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


@benchmark("serving")
def serving_load() -> dict[str, Any]:
    """The Conductor API under bounded loopback load: 200 requests (one in ten streamed) from
    16 concurrent clients against the API in process, with the scripted policy and the
    sandbox's zero-latency simulated workers (no response cache, so every request calls a
    worker). Throughput, latency percentiles, errors (target: none) and the asyncio tasks
    left in the server's event loop afterwards (target: none)."""
    import asyncio
    import tempfile
    from pathlib import Path

    import httpx

    from conductor_pipeline.benchmarks import percentile
    from conductor_pipeline.serving.app import ConductorService
    from conductor_pipeline.serving.server import BackgroundServer
    from conductor_pipeline.serving.settings import ServingSettings
    from conductor_pipeline.workers import WorkerPool
    from conductor_pipeline.workers.sandbox import SandboxServer
    from conductor_pipeline.workflow import OrchestrationConfig, PromptConfig
    from conductor_pipeline.workflow.policy import ScriptedPolicy

    n_requests, concurrency, warmup = 200, 16, 16
    questions = [
        "Compute the sum of 1234 and 4321.",
        "All cats are mammals. Are cats mammals? Yes or No.",
    ]

    def server_tasks(loop: asyncio.AbstractEventLoop) -> int:
        async def count() -> int:
            return len(asyncio.all_tasks()) - 1  # not this probe

        return asyncio.run_coroutine_threadsafe(count(), loop).result(timeout=10)

    with (
        tempfile.TemporaryDirectory() as tmp,
        SandboxServer(
            tasks_paths=_bench_tasks(Path(tmp)), latency_scale=0.0, load_real_model=False
        ) as sandbox,
    ):
        entries = sandbox.pool_config()
        for entry in entries:
            entry["max_concurrency"] = 64
        pool = WorkerPool.from_config({"workers": entries})
        service = ConductorService(
            policy=ScriptedPolicy(worker=pool.names.index("sim-abacus")),
            call_worker=pool,
            descriptions=pool.descriptions,
            worker_names=pool.names,
            orchestration=OrchestrationConfig(
                prompt=PromptConfig(assistant_prefill="model_id = [")
            ),
            settings=ServingSettings(max_concurrency=32, request_timeout_s=60),
        )
        with BackgroundServer(service) as server:
            server.wait_ready()

            async def load(count: int, offset: int) -> tuple[list[float], dict[int, int], int]:
                latencies: list[float] = []
                statuses: dict[int, int] = {}
                next_index = iter(range(count))
                limits = httpx.Limits(max_connections=concurrency)
                async with httpx.AsyncClient(
                    base_url=server.base_url, timeout=60, limits=limits
                ) as client:

                    async def one(i: int) -> None:
                        body = {
                            "model": "conductor",
                            "messages": [{"role": "user", "content": questions[i % 2]}],
                            "seed": offset + i,
                            "stream": i % 10 == 9,
                        }
                        start = time.perf_counter()
                        try:
                            response = await client.post("/chat/completions", json=body)
                            ok = response.status_code == 200 and (
                                '"finish_reason": "stop"' in response.text
                                if body["stream"]
                                else bool(response.json()["choices"][0]["message"]["content"])
                            )
                            status = response.status_code if ok else -response.status_code
                        except httpx.HTTPError:
                            status = 0
                        latencies.append(time.perf_counter() - start)
                        statuses[status] = statuses.get(status, 0) + 1

                    async def client_loop() -> None:
                        for i in next_index:
                            await one(i)

                    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
                leftover = len(asyncio.all_tasks()) - 1
                return latencies, statuses, leftover

            asyncio.run(load(warmup, 10_000))
            time.sleep(0.5)
            assert server.loop is not None
            baseline = server_tasks(server.loop)
            start = time.perf_counter()
            latencies, statuses, client_leftover = asyncio.run(load(n_requests, 0))
            wall = time.perf_counter() - start
            time.sleep(0.5)  # let closed connections wind down
            leaked = server_tasks(server.loop) - baseline
            in_flight_after = server.app.state.gate.active
        asyncio.run(pool.aclose())
    errors = n_requests - statuses.get(200, 0)
    return {
        "requests": n_requests,
        "concurrency": concurrency,
        "streamed_share": 0.1,
        "errors": errors,
        "errors_target": 0,
        "status_counts": {str(k): v for k, v in sorted(statuses.items())},
        "throughput_rps": n_requests / wall,
        "latency_p50_ms": percentile(latencies, 50) * 1000,
        "latency_p95_ms": percentile(latencies, 95) * 1000,
        "latency_max_ms": max(latencies) * 1000,
        "leaked_server_tasks": leaked,
        "leaked_client_tasks": client_leftover,
        "in_flight_after": in_flight_after,
        "policy": "scripted (one step to sim-abacus), sandbox latency 0, cache off",
    }


@benchmark("rewards")
def rollout_scoring() -> dict[str, Any]:
    """GRPO reward throughput in the sandbox: 64 rollouts (16 prepared questions × a group of
    4; one- and two-step workflows) parsed, executed on the simulated workers at the sandbox's
    latency scale (0.02) and verified, first with an empty response cache, then again with
    the cache warm (every worker reply a hit)."""
    import asyncio
    import tempfile
    from pathlib import Path

    from conductor_pipeline.tasks import Task
    from conductor_pipeline.training.configs import RewardConfig
    from conductor_pipeline.training.rewards import ConductorReward
    from conductor_pipeline.workers import ResponseCache, WorkerPool
    from conductor_pipeline.workers.sandbox import SandboxServer
    from conductor_pipeline.workflow import PromptConfig

    group = 4
    tasks = [
        Task(
            f"bench/add/{i}",
            "math",
            "easy",
            f"Compute the sum of {1000 + i} and 4321.",
            str(5321 + i),
            "number",
            "numeric",
            "bench",
        )
        for i in range(16)
    ]
    plans = [
        "Worker 1 computes it.\nmodel_id = [1]\nsubtasks = ['Solve the question.']\n"
        "access_list = [[]]",
        "Worker 4 tries, Worker 0 checks.\nmodel_id = [4, 0]\nsubtasks = ['Solve the question.',"
        " 'Check the answer above.']\naccess_list = [[], 'all']",
    ]
    texts = [plans[i % 2] for i in range(len(tasks) * group)]
    batch = [task for task in tasks for _ in range(group)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with SandboxServer(
            tasks_paths=_bench_tasks(folder, tasks), latency_scale=0.02, load_real_model=False
        ) as server:
            entries = [e for e in server.pool_config() if e["name"] != "smollm2-135m"]

            async def run() -> dict[str, Any]:
                pool = WorkerPool.from_config(
                    {"workers": entries}, cache=ResponseCache(folder / "cache.sqlite")
                )
                reward = ConductorReward(
                    pool,
                    pool.names,
                    pool.descriptions,
                    PromptConfig(question_to_workers=True),
                    RewardConfig(),
                    num_generations=group,
                )
                seconds = []
                for _ in ("cold", "warm"):
                    start = time.perf_counter()
                    scores = await reward.score_batch(texts, batch)
                    seconds.append(time.perf_counter() - start)
                    assert all(s.parsed for s in scores)
                await pool.aclose()
                n = len(texts)
                return {
                    "rollouts": n,
                    "cold_cache_rollouts_per_s": n / seconds[0],
                    "warm_cache_rollouts_per_s": n / seconds[1],
                    "cold_s": seconds[0],
                    "warm_s": seconds[1],
                    # the plans alternate one and two steps
                    "worker_calls_per_pass": sum(1 + i % 2 for i in range(n)),
                }

            return asyncio.run(run())
