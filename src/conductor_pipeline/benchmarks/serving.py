"""Benchmarks of the Conductor API (``make bench ARGS=serving``): load with the scripted
policy, and the project's real Conductor for one user and for 1 against 16 clients."""

from __future__ import annotations

import time
from typing import Any

from conductor_pipeline.benchmarks import bench_tasks, benchmark

# the two prepared questions of :func:`~conductor_pipeline.benchmarks.bench_tasks`
QUESTIONS = (
    "Compute the sum of 1234 and 4321.",
    "All cats are mammals. Are cats mammals? Yes or No.",
)


def project_conductor() -> tuple[Any, dict[str, Any], Any] | str:
    """The project's local Conductor as ``conductor serve`` resolves it: ``(project config,
    conductor parameters, served model)``, or why there is none to measure."""
    from conductor_pipeline.project import load_project_config
    from conductor_pipeline.serving.models import ModelResolutionError, resolve_served_model

    config = load_project_config()
    params = dict(config.parameters.get("conductor") or {})
    policy_params = dict(params.get("policy") or {})
    if policy_params.get("kind", "local") != "local":
        return "conductor.policy is not a local model"
    try:
        served = resolve_served_model(policy_params.get("adapter"), root=config.root)
    except ModelResolutionError as err:
        return str(err)
    return config, params, served


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
    from conductor_pipeline.serving.server import served_policy
    from conductor_pipeline.serving.settings import serving_settings
    from conductor_pipeline.workers.runtime import open_worker_pool
    from conductor_pipeline.workflow.config import orchestration_config

    found = project_conductor()
    if isinstance(found, str):
        return {"skipped": found}
    config, params, served = found
    policy_params = dict(params.get("policy") or {})
    settings = serving_settings(config.parameters.get("serving"))
    orchestration = orchestration_config(params)
    figures: dict[str, Any] = {
        "model": served.id,
        "adapter": bool(served.adapter_dir),
        "torch_threads": settings.torch_threads,
        "requests": requests,
        "temperature": orchestration.temperature,
        "max_tokens": orchestration.max_tokens,
    }
    try:
        with open_worker_pool(
            config.worker_pool, config.credentials, root=config.root, cache_mode="off"
        ) as pool:
            for label, warm_up in (("without_warm_up", False), ("with_warm_up", True)):
                # unbatched: one user, and the figures read the policy's own counters
                policy = served_policy(policy_params, served.adapter_dir, settings)
                figures[label] = serve_one_user(
                    policy, pool, orchestration, served, warm_up=warm_up, requests=requests
                )
                figures["dtype"] = getattr(policy, "loaded_dtype", None)  # serving.dtype resolved
    except Exception as err:  # e.g. no prepared tasks for the sandbox: say so, keep the suite
        figures["skipped"] = f"{type(err).__name__}: {err}"
        return figures
    before, after = figures["without_warm_up"], figures["with_warm_up"]
    figures["first_request_speedup"] = before["first_request_s"] / after["first_request_s"]
    figures["warm_p50_speedup"] = before["warm_p50_s"] / after["warm_p50_s"]
    return figures


def serve_one_user(
    policy: Any, pool: Any, orchestration: Any, served: Any, *, warm_up: bool, requests: int
) -> dict[str, Any]:
    """Start the API over ``policy`` and ``pool``, then send one request at a time."""
    import statistics

    import httpx

    from conductor_pipeline.benchmarks import percentile
    from conductor_pipeline.serving.server import BackgroundServer
    from conductor_pipeline.serving.service import ConductorService
    from conductor_pipeline.serving.settings import ServingSettings

    questions = list(QUESTIONS)
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

    from conductor_pipeline.benchmarks import percentile
    from conductor_pipeline.serving.server import BackgroundServer
    from conductor_pipeline.serving.service import ConductorService
    from conductor_pipeline.serving.settings import ServingSettings
    from conductor_pipeline.workers import WorkerPool
    from conductor_pipeline.workers.sandbox import SandboxServer
    from conductor_pipeline.workflow import OrchestrationConfig, PromptConfig
    from conductor_pipeline.workflow.policy import ScriptedPolicy

    n_requests, concurrency, warmup = 200, 16, 16
    questions = list(QUESTIONS)

    def server_tasks(loop: asyncio.AbstractEventLoop) -> int:
        async def count() -> int:
            return len(asyncio.all_tasks()) - 1  # not this probe

        return asyncio.run_coroutine_threadsafe(count(), loop).result(timeout=10)

    with (
        tempfile.TemporaryDirectory() as tmp,
        SandboxServer(
            tasks_paths=bench_tasks(Path(tmp)), latency_scale=0.0, load_real_model=False
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

            asyncio.run(_load(server.base_url, questions, concurrency, warmup, 10_000))
            time.sleep(0.5)
            assert server.loop is not None
            baseline = server_tasks(server.loop)
            start = time.perf_counter()
            latencies, statuses, client_leftover = asyncio.run(
                _load(server.base_url, questions, concurrency, n_requests, 0)
            )
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


async def _load(
    base_url: str, questions: list[str], concurrency: int, count: int, offset: int
) -> tuple[list[float], dict[int, int], int]:
    """``count`` requests from ``concurrency`` clients, one in ten streamed; returns the
    latencies, the status counts (negative: an unusable 200 or error body; 0: no answer)
    and the asyncio tasks this loop has left."""
    import asyncio

    import httpx

    latencies: list[float] = []
    statuses: dict[int, int] = {}
    next_index = iter(range(count))
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:

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
