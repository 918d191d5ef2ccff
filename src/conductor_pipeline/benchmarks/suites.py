"""The benchmark suites; each function is registered under the name the report uses."""

from __future__ import annotations

import time
from typing import Any

from conductor_pipeline.benchmarks import (
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
def serving_benchmark() -> dict[str, Any]:
    """The Conductor API: load with the scripted policy (:func:`serving_load`), then the real
    Conductor for one user (``real_policy``) and for 1 against 16 clients (``..._concurrency``)."""
    from conductor_pipeline.benchmarks.serving_concurrency import serving_concurrency

    figures = serving_load()
    figures["real_policy"] = serving_real_policy()
    figures["real_policy_concurrency"] = serving_concurrency()
    return figures


def serving_real_policy(requests: int = 10) -> dict[str, Any]:
    """What one user waits for from ``conductor serve`` on this machine: the project's
    Conductor (SmolLM2 with ``conductor.policy.adapter`` when it resolves, e.g. the
    registered champion after ``make run``; the base policy otherwise) in process, the
    configured sandbox pool (cache off, so every request calls its workers) and one
    request at a time over loopback HTTP, non-streamed.

    Measured twice, without and with the start-up warm-up (``serving.warm_up``): time to
    ready, the first request, then ``requests`` more (p50/p95), and where a warm request's
    time goes (Conductor generation, worker steps, the rest: HTTP and orchestration)."""
    from conductor_pipeline.project import load_project_config
    from conductor_pipeline.serving.models import ModelResolutionError, resolve_served_model
    from conductor_pipeline.workers.runtime import open_worker_pool
    from conductor_pipeline.workflow.config import build_policy, orchestration_config

    config = load_project_config()
    params = dict(config.parameters.get("conductor") or {})
    policy_params = dict(params.get("policy") or {})
    if policy_params.get("kind", "local") != "local":
        return {"skipped": "conductor.policy is not a local model"}
    try:
        served = resolve_served_model(policy_params.get("adapter"), root=config.root)
    except ModelResolutionError as err:
        return {"skipped": str(err)}
    orchestration = orchestration_config(params)
    figures: dict[str, Any] = {
        "model": served.id,
        "adapter": bool(served.adapter_dir),
        "torch_threads": policy_params.get("torch_threads"),
        "requests": requests,
        "temperature": orchestration.temperature,
        "max_tokens": orchestration.max_tokens,
    }
    try:
        with open_worker_pool(
            config.worker_pool, config.credentials, root=config.root, cache_mode="off"
        ) as pool:
            for label, warm_up in (("without_warm_up", False), ("with_warm_up", True)):
                policy = build_policy(policy_params, adapter_dir=served.adapter_dir)
                figures[label] = _serve_one_user(
                    policy, pool, orchestration, served, warm_up=warm_up, requests=requests
                )
    except Exception as err:  # e.g. no prepared tasks for the sandbox: say so, keep the suite
        figures["skipped"] = f"{type(err).__name__}: {err}"
        return figures
    before, after = figures["without_warm_up"], figures["with_warm_up"]
    figures["first_request_speedup"] = before["first_request_s"] / after["first_request_s"]
    figures["warm_p50_speedup"] = before["warm_p50_s"] / after["warm_p50_s"]
    return figures


def _serve_one_user(
    policy: Any, pool: Any, orchestration: Any, served: Any, *, warm_up: bool, requests: int
) -> dict[str, Any]:
    """Start the API over ``policy`` and ``pool``, then send one request at a time."""
    import statistics

    import httpx

    from conductor_pipeline.benchmarks import percentile
    from conductor_pipeline.serving.app import ConductorService
    from conductor_pipeline.serving.server import BackgroundServer
    from conductor_pipeline.serving.settings import ServingSettings

    questions = [
        "Compute the sum of 1234 and 4321.",
        "All cats are mammals. Are cats mammals? Yes or No.",
    ]
    service = ConductorService(
        policy=policy,
        call_worker=pool,
        descriptions=pool.descriptions,
        worker_names=pool.names,
        orchestration=orchestration,
        served=served,
        settings=ServingSettings(request_timeout_s=600, warm_up=warm_up),
    )
    start = time.perf_counter()
    latencies: list[float] = []
    parts: dict[str, list[float]] = {"conductor_s": [], "workers_s": [], "other_s": []}
    statuses: dict[str, int] = {}
    tokens: list[int] = []  # Conductor tokens written per warm request
    with BackgroundServer(service) as server:
        server.wait_ready(timeout_s=600)
        ready_s = time.perf_counter() - start
        with httpx.Client(base_url=server.base_url, timeout=600) as client:
            for i in range(requests + 1):
                body = {
                    "model": "conductor",
                    "messages": [{"role": "user", "content": questions[i % 2]}],
                    "seed": i,
                }
                sent = time.perf_counter()
                response = client.post("/chat/completions", json=body)
                wall = time.perf_counter() - sent
                latencies.append(wall)
                statuses[str(response.status_code)] = statuses.get(str(response.status_code), 0) + 1
                record = response.json().get("conductor") or {}
                conductor = sum(c["latency_s"] for c in record.get("conductor_calls") or [])
                workers = sum(s.get("latency_s") or 0.0 for s in record.get("steps") or [])
                if i:  # the first request is reported on its own
                    tokens.append(
                        sum(
                            c.get("completion_tokens") or 0
                            for c in record.get("conductor_calls") or []
                        )
                    )
                    parts["conductor_s"].append(conductor)
                    parts["workers_s"].append(workers)
                    parts["other_s"].append(wall - conductor - workers)
    warm = latencies[1:]
    return {
        "ready_s": ready_s,
        "first_request_s": latencies[0],
        "warm_p50_s": percentile(warm, 50),
        "warm_p95_s": percentile(warm, 95),
        "warm_mean_s": statistics.fmean(warm),
        "warm_breakdown_mean_s": {k: statistics.fmean(v) for k, v in parts.items()},
        "status_counts": statuses,
        "prefix_hits": getattr(policy, "prefix_hits", None),
        "warm_conductor_tokens_mean": statistics.fmean(tokens),
        # all single-request passes of the policy (warm-up and first request included)
        "forward_passes": getattr(policy, "forward_passes", None),
    }


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


# -- one GRPO step on CPU: stock TRL against the project's trainer ---------------------------------

# Sandbox-like questions (about 100-300 tokens each), one per domain the sandbox trains on.
_TRAINING_QUESTIONS = [
    "A bakery sells muffins in boxes of 6 and cookies in boxes of 8. On Monday it sold 14 "
    "boxes of muffins and 9 boxes of cookies. On Tuesday it sold twice as many boxes of "
    "muffins as on Monday but 3 fewer boxes of cookies. A muffin costs $1.75 and a cookie "
    "$0.60. The bakery pays $48 a day in rent and $0.35 in ingredients for every item it "
    "sells. What was the bakery's total profit over the two days, in dollars?",
    "On an island every inhabitant is either a knight, who always tells the truth, or a "
    "knave, who always lies. You meet four inhabitants: Ada, Ben, Cleo and Dan. Ada says: "
    '"Ben and Cleo are of the same kind." Ben says: "Dan is a knave." Cleo says: "Ada is a '
    'knight or Dan is a knight, but not both." Dan says: "Exactly two of us four are '
    'knights." Exactly how many of the four are knights, and which ones? Explain which '
    "statements rule out the other possibilities, then give the names of the knights.",
    "Write a Python function merge_intervals(intervals: list[list[int]]) -> "
    "list[list[int]].\n"
    '    """Merge all overlapping closed intervals and return them sorted by start.\n\n'
    "    Two intervals overlap when they share at least one point, so [1, 3] and [3, 5] "
    "merge into [1, 5]. The input may be empty, unsorted, and may contain intervals "
    "nested in others.\n\n"
    "    >>> merge_intervals([[1, 3], [2, 6], [8, 10], [15, 18]])\n"
    "    [[1, 6], [8, 10], [15, 18]]\n"
    "    >>> merge_intervals([[5, 7], [1, 4], [4, 5]])\n"
    "    [[1, 7]]\n"
    "    >>> merge_intervals([[1, 10], [2, 3], [4, 5]])\n"
    "    [[1, 10]]\n"
    "    >>> merge_intervals([])\n"
    "    []\n"
    '    """',
    "A robot starts in the top-left cell of a 5 x 6 grid and must reach the bottom-right "
    "cell. At each move it goes one cell right or one cell down. The cells in row 2, "
    "column 3 and in row 4, column 2 (counting rows and columns from 1 at the top-left) "
    "hold rocks and cannot be entered. In how many different ways can the robot reach "
    "its goal? Then say how the answer changes if the robot may also move one cell "
    "diagonally down and to the right, with the same rocks in place.",
    "Which of the following best explains why the ocean's surface layer in the tropics "
    "is often poor in nutrients even though sunlight is plentiful there?\n"
    "A) Tropical water is too warm for phytoplankton to take up nitrate and phosphate.\n"
    "B) A strong, permanent thermocline limits the mixing of deep, nutrient-rich water "
    "into the sunlit surface layer.\n"
    "C) Heavy rainfall dilutes the nutrients faster than rivers can supply them.\n"
    "D) Coral reefs absorb most of the dissolved nutrients before they reach open water.\n"
    "Answer with the letter of the correct option and one sentence of justification.",
    "A game uses two fair six-sided dice. A player rolls both dice; if the sum is 7 or "
    "11 the player wins immediately, and if the sum is 2, 3 or 12 the player loses "
    "immediately. Any other sum becomes the player's point, and the player keeps "
    "rolling both dice until either the point comes up again (a win) or a 7 comes up (a "
    "loss). (a) What is the probability that the player wins the game? Give it as a "
    "fraction in lowest terms. (b) What is the expected number of rolls in one game? "
    "(c) If the player bets $10 at even money on every game, what is the expected gain "
    "or loss after 100 games, to the nearest cent?",
]


def _sandbox_worker_descriptions() -> list[str]:
    """The six sandbox workers' descriptions (conf/base/sandbox_workers.yml)."""
    from conductor_pipeline.workers.sandbox.profiles import default_profiles_path, load_profiles

    profiles = load_profiles(default_profiles_path())
    return [p.description for p in (*profiles.simulated, *profiles.real)]


def _hash_reward(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """A deterministic reward in [0, 1) from the completion text: distinct completions get
    distinct rewards, so advantages are non-zero, with no worker pool involved."""
    import hashlib

    texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
    return [int(hashlib.sha256(t.encode()).hexdigest()[:8], 16) / 16**8 for t in texts]


def _timed_trainer(base: type, figures: dict[str, list[float]]) -> type:
    """``base`` with the seconds of generation, of the whole rollout (generation, rewards,
    advantages) and of each training step (rollout + loss forward and backward) recorded
    in ``figures``, and the prompt and completion lengths."""

    class Timed(base):  # type: ignore[misc, valid-type]
        def _generate_single_turn(self, prompt_ids, *args, **kwargs):  # noqa: ANN001, ANN202
            start = time.perf_counter()
            out = super()._generate_single_turn(prompt_ids, *args, **kwargs)
            figures["generation_s"].append(time.perf_counter() - start)
            figures["prompt_tokens"].extend(len(p) for p in prompt_ids)
            figures["completion_tokens"].extend(len(c) for c in out[0])
            return out

        def _prepare_inputs(self, generation_batch):  # noqa: ANN001, ANN202
            start = time.perf_counter()
            out = super()._prepare_inputs(generation_batch)
            figures["rollout_s"].append(time.perf_counter() - start)
            return out

        def training_step(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            start = time.perf_counter()
            out = super().training_step(*args, **kwargs)
            figures["train_step_s"].append(time.perf_counter() - start)
            return out

    return Timed


def _run_grpo_steps(
    trainer_class: type, config: Any, rows: list[dict[str, Any]], steps: int, folder: Any
) -> dict[str, list[float]]:
    """Train ``steps`` GRPO steps with ``trainer_class`` and return per-step figures."""
    from collections import defaultdict

    from datasets import Dataset
    from transformers import TrainerCallback

    from conductor_pipeline.training.grpo import _num_layers, grpo_args, load_base, lora_config

    figures: dict[str, list[float]] = defaultdict(list)

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN202
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN202
            figures["step_s"].append(time.perf_counter() - self.start)

    model, tokenizer = load_base(config)
    trainer = _timed_trainer(trainer_class, figures)(
        model=model,
        reward_funcs=[_hash_reward],
        args=grpo_args(
            config, folder, max_steps=steps, overrides={"save_strategy": "no", "logging_steps": 1}
        ),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=lora_config(config, _num_layers(model)),
        callbacks=[StepClock()],
    )
    trainer.train()
    figures["fast_path_calls"] = list(getattr(trainer, "fast_path_calls", {}).values())
    return figures


def training_step_benchmark(
    config: Any,
    prompt: Any,
    descriptions: list[str],
    *,
    steps: int = 2,
    warmup: int = 1,
) -> dict[str, Any]:
    """Seconds per GRPO step of stock ``trl.GRPOTrainer`` and of the project's trainer, with
    the same ``GRPOConfig`` (``grpo.grpo_args(config)``), model, LoRA, prompts and reward.

    Each trainer trains ``warmup + steps`` steps; the first ``warmup`` are not measured.
    ``generation_s`` is the time in ``_generate_single_turn``, ``scoring_s`` the loss
    forward and backward (a training step minus its rollout), ``other_s`` the rest of the
    step (rewards, advantages, optimizer, TRL's bookkeeping).
    """
    import statistics
    import tempfile
    from pathlib import Path

    from trl import GRPOTrainer

    from conductor_pipeline.training.grpo import conductor_trainer_class
    from conductor_pipeline.workflow import conductor_messages

    total = warmup + steps
    n_prompts = total * config.grpo.prompts_per_step
    questions = [_TRAINING_QUESTIONS[i % len(_TRAINING_QUESTIONS)] for i in range(n_prompts)]
    rows = [{"prompt": conductor_messages(q, descriptions, prompt)} for q in questions]

    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else float("nan")

    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, trainer_class in (("stock", GRPOTrainer), ("project", conductor_trainer_class())):
            raw = _run_grpo_steps(trainer_class, config, rows, total, Path(tmp) / name)
            per_step = len(raw["completion_tokens"]) // total
            step = raw["step_s"][warmup:]
            generation = raw["generation_s"][warmup:]
            rollout = raw["rollout_s"][warmup:]
            scoring = [t - r for t, r in zip(raw["train_step_s"][warmup:], rollout, strict=True)]
            completions = raw["completion_tokens"][warmup * per_step :]
            figures[f"{name}_step_s"] = mean(step)
            figures[f"{name}_generation_s"] = mean(generation)
            figures[f"{name}_scoring_s"] = mean(scoring)
            figures[f"{name}_other_s"] = mean(step) - mean(generation) - mean(scoring)
            figures[f"{name}_completion_tokens_mean"] = mean(completions)
            figures[f"{name}_completion_tokens_per_step"] = sum(completions) / steps
            figures[f"{name}_seconds_per_completion_token"] = (
                sum(step) / sum(completions) if completions else float("nan")
            )
            figures[f"{name}_step_s_all"] = [round(s, 3) for s in raw["step_s"]]
            if name == "project":
                figures["project_fast_path_calls"] = dict(
                    zip(("generation", "scoring"), raw["fast_path_calls"], strict=False)
                )
            prompt_tokens = raw["prompt_tokens"]
    figures["step_cost_ratio"] = figures["stock_step_s"] / figures["project_step_s"]
    figures["generation_cost_ratio"] = (
        figures["stock_generation_s"] / figures["project_generation_s"]
    )
    figures["scoring_cost_ratio"] = figures["stock_scoring_s"] / figures["project_scoring_s"]
    figures["per_completion_token_cost_ratio"] = (
        figures["stock_seconds_per_completion_token"]
        / figures["project_seconds_per_completion_token"]
    )
    figures.update(
        steps_measured=steps,
        warmup_steps=warmup,
        num_generations=config.grpo.num_generations,
        prompts_per_step=config.grpo.prompts_per_step,
        max_completion_length=config.grpo.max_completion_length,
        prompt_tokens_min=min(prompt_tokens),
        prompt_tokens_mean=mean(prompt_tokens),
        prompt_tokens_max=max(prompt_tokens),
        base_model=config.base_model,
    )
    return figures


@benchmark("training")
def training_step_cost() -> dict[str, Any]:
    """One sandbox GRPO step on CPU: stock TRL against the project's trainer (SmolLM2-135M,
    the sandbox LoRA and GRPO settings of conf/base/parameters_training.yml, the sandbox
    prompt of conf/base/parameters_conductor.yml with the six sandbox workers, a hash
    reward), each after one warm-up step. The time grows with the configured rollouts per
    step (stock TRL: about 12 minutes a step for 8 x 4 rollouts on one busy core), so the
    environment can override: ``BENCH_TRAINING_STEPS`` (measured steps, default 1),
    ``BENCH_NUM_GENERATIONS``, ``BENCH_PROMPTS_PER_STEP``, ``BENCH_MAX_COMPLETION_LENGTH``,
    ``BENCH_TORCH_THREADS`` (default: torch's; on a 2-core box shared with other work, 1
    avoids OpenMP threads waiting on each other)."""
    import os

    import torch
    import yaml

    from conductor_pipeline.paths import project_root
    from conductor_pipeline.training.configs import TrainingConfig
    from conductor_pipeline.workflow.config import prompt_config

    conf = project_root() / "conf" / "base"
    training = yaml.safe_load((conf / "parameters_training.yml").read_text())["training"]
    conductor = yaml.safe_load((conf / "parameters_conductor.yml").read_text())["conductor"]
    grpo = dict(training.get("grpo") or {})
    for key in ("num_generations", "prompts_per_step", "max_completion_length"):
        value = os.environ.get(f"BENCH_{key.upper()}")
        if value:
            grpo[key] = int(value)
    config = TrainingConfig.from_params({**training, "grpo": grpo})
    threads = os.environ.get("BENCH_TORCH_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    load_before = os.getloadavg()[0]
    figures = training_step_benchmark(
        config,
        prompt_config(conductor.get("prompt")),
        _sandbox_worker_descriptions(),
        steps=int(os.environ.get("BENCH_TRAINING_STEPS", "1")),
    )
    figures["torch_threads"] = torch.get_num_threads()
    # other processes on the box slow both trainers, unevenly: the load says how busy it was
    figures["load_average_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return figures
