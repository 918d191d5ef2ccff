"""The routing table: where each Conductor system sends the answer step, and which workflow
shapes it writes, per domain, read from the per-question results."""

from __future__ import annotations

import asyncio

import pytest

from conductor_pipeline.evaluation import (
    ROUTING_COLUMNS,
    EvaluationConfig,
    PolicyUnderTest,
    evaluate,
    results_frame,
    routing_table,
)
from conductor_pipeline.workflow import SHAPES, OrchestrationConfig

from .fakes import FakePool, ScriptedConductor, make_tasks

TASKS = make_tasks(4)  # 4 math, 4 logic


@pytest.fixture(scope="module")
def results():
    """conductor: solve (mathy for maths, ace otherwise) then ace checks; one logic question
    gets no workflow. warm-start: one step, maths to dud. Plus solo rows, which are ignored."""
    pool = FakePool(TASKS)
    conductor = ScriptedConductor(math_worker=1, two_steps=True, bad=("logic 3",))
    run = asyncio.run(
        evaluate(
            TASKS,
            pool.view(),
            EvaluationConfig.from_params({"systems": ["conductor", "warm-start", "solo"]}),
            orchestration=OrchestrationConfig(max_parse_attempts=1),
            conductor=PolicyUnderTest(conductor, "v", "trained"),
            warm_start=PolicyUnderTest(ScriptedConductor(math_worker=2), "w", "sft"),
            pool_id="p",
            progress=False,
        )
    )
    return results_frame(run.results)


def _share(table, system, domain, kind, value):
    row = table[
        (table["system"] == system)
        & (table["domain"] == domain)
        & (table["kind"] == kind)
        & (table["value"] == value)
    ]
    assert len(row) == 1, (system, domain, kind, value)
    return float(row["share"].iloc[0])


def test_answer_workers_shapes_and_multi_step_share_per_domain(results):
    table = routing_table(results)
    assert list(table.columns) == ROUTING_COLUMNS
    assert set(table["system"]) == {"conductor", "warm-start"}
    assert set(table["domain"]) == {"math", "logic", "(all)"}
    # the checker (ace, worker 0) writes every answer of the two-step conductor
    assert _share(table, "conductor", "math", "worker", "ace") == 1.0
    assert _share(table, "conductor", "math", "shape", "solve_check") == 1.0
    assert _share(table, "conductor", "math", "workflow", "multi_step") == 1.0
    assert _share(table, "conductor", "logic", "worker", "ace") == 0.75
    assert _share(table, "conductor", "logic", "worker", "(no workflow)") == 0.25
    assert _share(table, "conductor", "logic", "shape", "(no workflow)") == 0.25
    assert _share(table, "conductor", "(all)", "workflow", "multi_step") == 7 / 8
    # the warm start: one step, maths to dud
    assert _share(table, "warm-start", "math", "worker", "dud") == 1.0
    assert _share(table, "warm-start", "math", "worker", "mathy") == 0.0  # listed, with 0
    assert _share(table, "warm-start", "logic", "shape", "single") == 1.0
    assert _share(table, "warm-start", "(all)", "workflow", "multi_step") == 0.0
    # every shape is listed, and each kind sums to one per system and domain
    assert set(SHAPES) <= set(table.loc[table["kind"] == "shape", "value"])
    sums = table[table["kind"] != "workflow"].groupby(["system", "domain", "kind"])["share"].sum()
    assert sums.to_numpy() == pytest.approx(1.0)
    assert (table.loc[table["domain"] == "math", "n"] == 4).all()


def test_no_conductor_rows_give_an_empty_table(results):
    table = routing_table(results[results["system"].str.startswith("solo:")])
    assert table.empty and list(table.columns) == ROUTING_COLUMNS
