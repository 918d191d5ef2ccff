"""Injected faults through a real sandbox pool change no answer: the Router's retries and the
evaluation's own absorb them, and a pair whose retries ran out is left out, not scored."""

from __future__ import annotations

import asyncio

from conductor_pipeline.evaluation import (
    EvaluationConfig,
    PolicyUnderTest,
    PoolView,
    evaluate,
    results_frame,
    summarise,
)
from conductor_pipeline.workers.faults import FaultInjector, ProviderFaults
from conductor_pipeline.workers.runtime import open_worker_pool

from .conftest import sandbox_pool_config
from .fakes import ScriptedConductor, make_tasks

SYSTEMS = [
    "conductor",
    "base-policy",
    "solo",
    "moa",
    "random-workflow",
    "best-of-n",
    "router",
    "handcrafted",
]


def _evaluate(pool, tasks, validation, config):
    return asyncio.run(
        evaluate(
            tasks,
            PoolView.from_pool(pool),
            config,
            conductor=PolicyUnderTest(
                ScriptedConductor(math_worker=1, two_steps=True), "v", "scripted"
            ),
            base_policy=PolicyUnderTest(ScriptedConductor(math_worker=3), "b", "base"),
            validation_tasks=validation,
            pool_id="sandbox",
            progress=False,
        )
    )


def test_thirty_percent_provider_faults_from_config_change_no_answer(prepared):
    root, test_path, validation_path = prepared
    tasks, validation = make_tasks(3), make_tasks(2, "validation")
    config = EvaluationConfig.from_params(
        {"systems": SYSTEMS + ["oracle"], "conductor": {"max_parse_attempts": 1}}
    )
    clean_config = sandbox_pool_config([test_path, validation_path])
    clean_config["cache"]["path"] = "data/03_primary/clean_cache.sqlite"
    with open_worker_pool(clean_config, root=root) as pool:
        assert pool.faults is None
        clean = _evaluate(pool, tasks, validation, config)

    faulty_config = sandbox_pool_config([test_path, validation_path])
    faulty_config["faults"] = {
        "level": "provider",
        "seed": 5,
        "rates": {"timeout": 0.1, "rate_limit": 0.1, "provider_error": 0.1},
    }
    with open_worker_pool(faulty_config, root=root) as pool:
        assert isinstance(pool.faults, ProviderFaults)  # the configured faults reached the pool
        run = _evaluate(pool, tasks, validation, config)
        injected = sum(pool.faults.stats["injected"].values())
    assert injected > 0
    assert run.info["infra_failed_pairs"] == 0
    answers = {(r.system, r.split, r.question_id): (r.answer, r.correct) for r in run.results}
    expected = {(r.system, r.split, r.question_id): (r.answer, r.correct) for r in clean.results}
    assert answers == expected
    columns = ["system", "n", "accuracy", "infra_failures"]
    faulty_table = summarise(results_frame(run.results), samples=200)[columns]
    assert faulty_table.equals(summarise(results_frame(clean.results), samples=200)[columns])


def test_a_dead_pool_leaves_every_pair_out_and_counts_it(prepared):
    root, test_path, validation_path = prepared
    tasks = make_tasks(2)
    config = EvaluationConfig.from_params(
        {"systems": ["conductor", "solo", "moa", "oracle"], "infra_retries": 1, "retry_delay_s": 0}
    )
    pool_config = sandbox_pool_config([test_path, validation_path], cache_mode="off")
    pool_config["faults"] = {"level": "pool", "rates": {"timeout": 1.0}}
    with open_worker_pool(pool_config, root=root) as pool:
        assert isinstance(pool.faults, FaultInjector)
        run = asyncio.run(
            evaluate(
                tasks,
                PoolView.from_pool(pool),
                config,
                conductor=PolicyUnderTest(ScriptedConductor(), "v", "scripted"),
                progress=False,
            )
        )
    assert run.info["worker_call_retries"]["exhausted"] > 0
    summary = summarise(results_frame(run.results), samples=200).set_index("system")
    assert (summary["n"] == 0).all()  # no pair was scored wrong for a dead pool
    assert summary["accuracy"].isna().all()
    assert (summary["infra_failures"] == len(tasks)).all()
