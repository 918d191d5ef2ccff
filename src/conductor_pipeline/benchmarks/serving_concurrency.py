"""The serving benchmark's concurrency case (``results.serving.real_policy_concurrency``):
one client against 16 concurrent clients of the project's real Conductor."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from typing import Any

from conductor_pipeline.benchmarks.serving import QUESTIONS, project_conductor


def serving_concurrency(
    clients: tuple[int, ...] = (1, 16), requests_per_client: int = 16, single_requests: int = 32
) -> dict[str, Any]:
    """Throughput and latency of ``conductor serve`` as ``conductor serve`` builds it: the
    project's Conductor (``conductor.policy`` with its adapter when it resolves, e.g. the
    champion after ``make run``) behind the micro-batcher (``serving.batching``), warmed up,
    the configured sandbox pool with the cache off, non-streamed requests over loopback HTTP.

    For each client count ``c`` the same server answers ``c`` clients that each send their
    next request as soon as the last is answered: first one request per client, not
    measured but reported (``first_round_s``: a burst after idle, whose first request
    finds nothing to batch with and runs alone), then ``single_requests`` in all for one
    client, ``c * requests_per_client`` otherwise. Reported per count: throughput, p50/p95
    latency, status counts, the sizes of the batches the measured part started and how
    many samples joined a batch already generating, and the worker calls by worker; then the
    throughput ratio of the largest count to one client (target: 4). The windows are long
    (256 and 32 requests) because a call to the sandbox's real worker, about one in 150,
    takes CPU from the Conductor: in a short window it lands in some runs and not others."""
    import dataclasses

    from conductor_pipeline.serving.server import in_process_policy
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
    policy = in_process_policy(policy_params, served.adapter_dir, settings)
    figures: dict[str, Any] = {
        "model": served.id,
        "adapter": bool(served.adapter_dir),
        "torch_threads": settings.torch_threads,
        "batching": dataclasses.asdict(settings.batching),
        "max_concurrency": settings.max_concurrency,
        "temperature": orchestration.temperature,
        "max_tokens": orchestration.max_tokens,
    }
    try:
        with open_worker_pool(
            config.worker_pool, config.credentials, root=config.root, cache_mode="off"
        ) as pool:
            load = (clients, requests_per_client, single_requests)
            figures.update(
                measure_client_loads(policy, pool, orchestration, served, settings, *load)
            )
        # serving.dtype as it resolved on this machine (auto: bfloat16 where the CPU has it)
        figures["dtype"] = getattr(policy, "loaded_dtype", None)
    except Exception as err:  # e.g. no prepared tasks for the sandbox: say so, keep the suite
        figures["skipped"] = f"{type(err).__name__}: {err}"
        return figures
    one, most = figures.get("clients_1"), figures.get(f"clients_{max(clients)}")
    if one and most:
        figures["throughput_ratio"] = most["throughput_rps"] / one["throughput_rps"]
        figures["throughput_ratio_target"] = 4.0
    return figures


def measure_client_loads(
    policy: Any,
    pool: Any,
    orchestration: Any,
    served: Any,
    settings: Any,
    clients: tuple[int, ...],
    requests_per_client: int,
    single_requests: int,
) -> dict[str, Any]:
    """Start the API once, wait for the warm-up, then load it with each client count."""
    import dataclasses

    from conductor_pipeline.serving.server import BackgroundServer
    from conductor_pipeline.serving.service import ConductorService

    service = ConductorService(
        policy=policy,
        call_worker=pool,
        descriptions=pool.descriptions,
        worker_names=pool.names,
        orchestration=orchestration,
        served=served,
        settings=dataclasses.replace(settings, request_timeout_s=900, warm_up=True),
    )
    out: dict[str, Any] = {}
    start = time.perf_counter()
    with BackgroundServer(service) as server:
        server.wait_ready(timeout_s=900)
        out["ready_s"] = time.perf_counter() - start
        for count in clients:
            total = single_requests if count == 1 else count * requests_per_client
            first_round = asyncio.run(_load(server.base_url, count, count))
            stats = getattr(policy, "stats", None)
            before = dict(stats.sizes) if stats is not None else {}
            joined = stats.joined if stats is not None else 0
            called = Counter(r.worker for r in getattr(pool, "usage_log", ()))
            out[f"clients_{count}"] = asyncio.run(_load(server.base_url, count, total))
            out[f"clients_{count}"]["first_round_s"] = first_round["wall_s"]
            # the workers the measured part called: a simulated one sleeps, a real local model
            # (the sandbox's SmolLM2) takes CPU from the Conductor, so its calls explain much
            # of the spread between runs
            called = Counter(r.worker for r in getattr(pool, "usage_log", ())) - called
            out[f"clients_{count}"]["worker_calls"] = dict(sorted(called.items()))
            if stats is not None:
                sizes = {n: c - before.get(n, 0) for n, c in stats.sizes.items()}
                out[f"clients_{count}"]["batch_sizes"] = {
                    str(n): c for n, c in sorted(sizes.items()) if c
                }
                # samples that joined a batch already generating (continuous batching)
                out[f"clients_{count}"]["joined_rows"] = stats.joined - joined
    return out


async def _load(base_url: str, clients: int, total: int) -> dict[str, Any]:
    """``clients`` closed-loop clients sharing ``total`` requests."""
    import httpx

    from conductor_pipeline.benchmarks import percentile

    latencies: list[float] = []
    conductor_s: list[float] = []
    statuses: dict[str, int] = {}
    indices = iter(range(total))
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=base_url, timeout=900, limits=limits) as client:

        async def one_client() -> None:
            for i in indices:
                body = {
                    "model": "conductor",
                    "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                    "seed": i,
                }
                sent = time.perf_counter()
                response = await client.post("/chat/completions", json=body)
                latencies.append(time.perf_counter() - sent)
                key = str(response.status_code)
                statuses[key] = statuses.get(key, 0) + 1
                if response.status_code == 200:
                    calls = (response.json().get("conductor") or {}).get("conductor_calls") or []
                    conductor_s.append(sum(c["latency_s"] for c in calls))

        start = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        wall = time.perf_counter() - start
    return {
        "requests": total,
        "wall_s": wall,
        "throughput_rps": total / wall,
        "latency_p50_s": percentile(latencies, 50),
        "latency_p95_s": percentile(latencies, 95),
        "conductor_generation_mean_s": statistics.fmean(conductor_s) if conductor_s else None,
        "status_counts": statuses,
    }
