"""Each system on a deterministic fake pool: what it calls, what it answers, what it costs."""

from __future__ import annotations

import asyncio
import random

import pytest

from conductor_pipeline.evaluation import (
    BestOfNSystem,
    ConductorSystem,
    EvaluationConfig,
    MoASystem,
    PolicyUnderTest,
    RandomWorkflowSystem,
    SoloSystem,
    evaluate,
    majority_vote,
    random_workflow,
)
from conductor_pipeline.workers.types import Usage, WorkerReply
from conductor_pipeline.workflow import OrchestrationConfig

from .fakes import FakePool, ScriptedConductor, make_tasks

TASKS = make_tasks(4)
MATH, LOGIC = TASKS[0], TASKS[4]


def run(coro):
    return asyncio.run(coro)


def test_solo_sends_the_question_as_is():
    pool = FakePool(TASKS)
    result = run(SoloSystem(pool.view(), 1, pool_id="p").run(MATH, "test"))
    assert pool.messages == [("mathy", MATH.question)]
    assert result.system == "solo:mathy" and result.correct
    assert result.calls == 1 and result.tokens == len(MATH.question.split()) + 10
    assert result.cost_usd == pytest.approx(len(MATH.question.split()) * 1e-6 + 10 * 4e-6)
    wrong = run(SoloSystem(pool.view(), 1, pool_id="p").run(LOGIC, "test"))
    assert not wrong.correct and wrong.extracted == str(int(LOGIC.answer) + 1)


def test_cache_hits_are_charged_at_list_price():
    async def cached(worker, messages, sample_index=0):
        return WorkerReply(
            "w",
            "The answer is 200.",
            Usage(prompt_tokens=100, completion_tokens=10, cache_hit=True),
        )

    view = FakePool(TASKS).view()
    view.caller = cached
    result = run(SoloSystem(view, 0, pool_id="p").run(MATH, "test"))
    assert result.cost_usd == pytest.approx(100 * 1e-5 + 10 * 4e-5)
    assert result.cache_hits == 1


def test_moa_proposers_then_one_aggregator_seeing_all_proposals():
    pool = FakePool(TASKS)
    moa = MoASystem(pool.view(), [0, 1, 2], layers=1, aggregator="random", seed=3, pool_id="p")
    result = run(moa.run(LOGIC, "test"))
    assert result.calls == 4 and result.n_steps == 4
    proposals = [text for _, text in pool.messages[:3]]
    assert proposals == [LOGIC.question] * 3  # layer 1 = the question as is (shares the solo cache)
    aggregator, text = pool.messages[3]
    assert aggregator == moa.pool.names[moa.pick_aggregator(LOGIC)]
    assert text.count("The answer is") == 3 and LOGIC.question in text
    assert result.detail["aggregator"] == aggregator
    # deterministic: the same aggregator for the same question and seed
    assert moa.pick_aggregator(LOGIC) == moa.pick_aggregator(LOGIC)
    two_layers = MoASystem(pool.view(), [0, 1], layers=2, aggregator="ace", pool_id="p")
    assert run(two_layers.run(MATH, "test")).calls == 5 and two_layers.pick_aggregator(MATH) == 0


def test_moa_falls_back_to_a_proposal_when_the_aggregator_fails():
    pool = FakePool(TASKS, fail={"ace": 2})  # ace's second call (the aggregation) fails
    result = run(MoASystem(pool.view(), [0, 1], aggregator="ace", pool_id="p").run(MATH, "test"))
    assert result.failed_calls == 1 and result.infra_failure
    assert result.correct and "aggregator failed" in result.note


def test_random_workflow_shape():
    rng = random.Random(0)
    lengths = []
    for _ in range(400):
        wf = random_workflow(MATH.question, 3, 2.25, rng)
        lengths.append(len(wf))
        assert all(MATH.question in s.subtask for s in wf.steps)
        assert wf.steps[0].access == ()
        for i, step in enumerate(wf.steps[1:], start=1):
            assert step.access in ((), tuple(range(i)))  # binary access: all or nothing
    assert set(lengths) == {2, 3}
    assert sum(lengths) / len(lengths) == pytest.approx(2.25, abs=0.08)
    pool = FakePool(TASKS)
    system = RandomWorkflowSystem(pool.view(), 2.0, seed=1, pool_id="p")
    first = run(system.run(MATH, "test"))
    again = run(
        RandomWorkflowSystem(FakePool(TASKS).view(), 2.0, seed=1, pool_id="p").run(MATH, "test")
    )
    assert first.n_steps == 2 and first.calls == 2
    assert first.workers == again.workers and first.correct == again.correct


def test_best_of_n_majority_vote():
    assert majority_vote(["x = 3", "The answer is 4", "answer: 4.0", None], "number")[0] == 1
    assert majority_vote(["The answer is 5", "The answer is 6"], "number")[0] == 0  # tie: earliest
    assert majority_vote([None, None], "number") == (None, {})
    pool = FakePool(TASKS)
    system = BestOfNSystem(pool.view(), 2, 3, pool_id="p")  # dud: every sample wrong, all differ
    result = run(system.run(MATH, "test"))
    assert system.name == "best-of-n:dud" and result.calls == 3 and not result.correct
    assert result.detail["chosen_sample"] == 0
    right = run(BestOfNSystem(pool.view(), 0, 3, pool_id="p").run(MATH, "test"))
    assert right.correct and right.detail["votes"] == {"200.0": 3}


def test_conductor_system_records_workflow_and_parse_failures():
    pool = FakePool(TASKS)
    policy = ScriptedConductor(bad=["math 1"], two_steps=True)
    system = ConductorSystem(
        "conductor",
        policy,
        pool.view(),
        OrchestrationConfig(max_parse_attempts=2),
        variant="v",
        label="scripted",
    )
    good = run(system.run(MATH, "test"))
    assert good.correct and good.n_steps == 2 and good.access_pattern == "chain"
    assert good.workers == ["mathy", "ace"] and good.conductor_tokens == 70
    assert good.detail["worker_names"] == ["ace", "mathy", "dud"]
    bad = run(system.run(TASKS[1], "test"))
    assert bad.parse_failure and not bad.correct and bad.failed_samples == 2 and bad.calls == 0


def test_full_evaluation_derives_router_oracle_and_sizes_the_baselines():
    tasks, validation = make_tasks(4), make_tasks(3, "validation")
    pool = FakePool(tasks + validation)
    config = EvaluationConfig.from_params({"best_of_n": {"max_n": 5}})
    conductor = PolicyUnderTest(ScriptedConductor(two_steps=True), "v1", "scripted")
    out = run(
        evaluate(
            tasks,
            pool.view(),
            config,
            conductor=conductor,
            base_policy=PolicyUnderTest(ScriptedConductor(math_worker=2), "base", "base"),
            validation_tasks=validation,
            progress=False,
        )
    )
    systems = {r.system for r in out.results}
    assert systems == {
        "conductor",
        "conductor+recursion",
        "base-policy",
        "solo:ace",
        "solo:mathy",
        "solo:dud",
        "moa",
        "random-workflow",
        "best-of-n:ace",
        "router",
        "handcrafted",
        "oracle",
    }
    tested = [r for r in out.results if r.split == "test"]
    assert all(sum(r.system == s for r in tested) == len(tasks) for s in systems)
    assert out.info["router"] == {"math": "mathy", "logic": "ace"}  # ties broken by cost
    assert out.info["random_workflow_mean_steps"] == 2.0
    assert out.info["best_of_n"]["worker"] == "ace"  # the most expensive
    # the most expensive worker checks; the router's pick among the others solves
    assert out.info["handcrafted"] == {"math": ["mathy", "ace"], "logic": ["dud", "ace"]}
    router = {r.question_id: r for r in out.results if r.system == "router"}
    assert all(r.correct for r in router.values())
    assert router[tasks[0].id].note == "routed to mathy"
    oracle = {r.question_id: r for r in out.results if r.system == "oracle"}
    solo_mathy = {r.question_id: r for r in out.results if r.system == "solo:mathy"}
    assert oracle[tasks[0].id].cost_usd == solo_mathy[tasks[0].id].cost_usd  # cheapest right one
    # conductor+recursion kept the answer: its round 0 reused the conductor's sample
    assert out.info["shared_samples"] >= len(tasks)
    # validation questions were asked of the solo workers only (the router's fitting data)
    fitted = [r for r in out.results if r.split == "validation"]
    assert {r.system for r in fitted} == {"solo:ace", "solo:mathy", "solo:dud"}
    assert len(fitted) == 3 * len(validation)


async def test_the_pool_view_passes_the_executors_call_options_on():
    """A request budget caps max_tokens per call (workflow/budget.py); evaluation's view of
    the pool refused the keyword, so every budgeted GPU-profile call was a provider error."""
    from conductor_pipeline.evaluation.systems import PoolView
    from conductor_pipeline.workers.types import Usage, WorkerReply

    asked: list[dict] = []

    async def caller(worker, messages, sample_index=0, **overrides):
        asked.append(overrides)
        return WorkerReply("sim-a", "ok", Usage())

    view = PoolView(caller, ["sim-a"], ["a worker"])
    reply = await view(0, [{"role": "user", "content": "q"}], 0, max_tokens=7)
    assert reply.text == "ok" and asked == [{"max_tokens": 7}]
