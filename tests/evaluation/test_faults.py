"""A pool where 30 % of calls fail: the evaluation completes, and every failure is counted."""

from __future__ import annotations

import asyncio

import pytest

from conductor_pipeline.evaluation import (
    EvaluationConfig,
    PolicyUnderTest,
    PoolView,
    evaluate,
    results_frame,
    summarise,
)
from conductor_pipeline.workers.runtime import open_worker_pool

from .conftest import sandbox_pool_config
from .fakes import ScriptedConductor, make_tasks


def test_failure_heavy_pool_completes_with_failures_counted(prepared):
    root, test_path, validation_path = prepared
    tasks, validation = make_tasks(3), make_tasks(2, "validation")
    config = EvaluationConfig.from_params({"conductor": {"max_parse_attempts": 1}})
    rates = {"timeout": 0.1, "rate_limit": 0.1, "provider_error": 0.1}
    with open_worker_pool(
        sandbox_pool_config([test_path, validation_path], cache_mode="off"),
        root=root,
        fault_rates=rates,
    ) as pool:
        view = PoolView.from_pool(pool)
        run = asyncio.run(
            evaluate(
                tasks,
                view,
                config,
                conductor=PolicyUnderTest(
                    ScriptedConductor(math_worker=1, two_steps=True), "v", "scripted"
                ),
                base_policy=PolicyUnderTest(ScriptedConductor(math_worker=3), "b", "base"),
                validation_tasks=validation,
                progress=False,
            )
        )
        injected = sum(pool.injector.stats["injected"].values())
    everything = results_frame(run.results)
    frame = everything[everything["split"] == "test"]
    summary = summarise(everything, samples=200).set_index("system")
    # every system answered every question: nothing dropped
    assert (summary["n"] == len(tasks)).all()
    assert (
        len(summary) == 3 + 4 + 1 + 1 + 1 + 2
    )  # conductors, solos, moa, random, best-of-n, router+oracle
    failed = frame[frame["failed_calls"] > 0]
    assert injected > 0 and len(failed) > 0
    # (the validation questions the router was fitted on are in the table too)
    recorded = int(
        everything[~everything["system"].isin(["router", "oracle"])]["failed_calls"].sum()
    )
    assert recorded == injected  # every injected failure is in some question's record
    for system, rows in frame.groupby("system"):
        assert summary.loc[system, "infra_failures"] == int(rows["infra_failure"].sum())
        assert summary.loc[system, "failed_calls"] == int(rows["failed_calls"].sum())
    # an infra-failed question without an answer counts as wrong, and is still counted
    unanswered = frame[(frame["infra_failure"]) & (frame["answer"] == "")]
    assert not unanswered["correct"].any()
    assert (frame.groupby("system").size() == len(tasks)).all()
    assert summary["accuracy"].between(0, 1).all()


@pytest.mark.parametrize("rates", [{"timeout": 1.0}])
def test_a_dead_pool_still_yields_a_full_table(prepared, rates):
    root, test_path, validation_path = prepared
    tasks = make_tasks(2)
    config = EvaluationConfig.from_params({"systems": ["conductor", "solo", "moa", "oracle"]})
    with open_worker_pool(
        sandbox_pool_config([test_path, validation_path], cache_mode="off"),
        root=root,
        fault_rates=rates,
    ) as pool:
        run = asyncio.run(
            evaluate(
                tasks,
                PoolView.from_pool(pool),
                config,
                conductor=PolicyUnderTest(ScriptedConductor(), "v", "scripted"),
                progress=False,
            )
        )
    summary = summarise(results_frame(run.results), samples=200).set_index("system")
    assert (summary["n"] == len(tasks)).all()
    assert (summary["accuracy"] == 0).all()
    assert (summary["infra_failures"] == len(tasks)).all()
