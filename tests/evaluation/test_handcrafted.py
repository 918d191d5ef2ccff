"""The hand-written pipeline baseline: told each question's domain, the domain's solver
answers and a checker that sees the attempt gives the final answer."""

from __future__ import annotations

import asyncio

import pytest

from conductor_pipeline.evaluation import (
    EvaluationConfig,
    ResultStore,
    evaluate,
    handcrafted_workflow,
)
from conductor_pipeline.evaluation.kinds import Handcrafted as HandcraftedSettings
from conductor_pipeline.evaluation.metrics import system_order

from .fakes import FakePool, make_tasks

TASKS = make_tasks(3)  # 3 math, 3 logic
VALIDATION = make_tasks(2, "validation")
MATH, LOGIC = TASKS[0], TASKS[3]


def _evaluate(params, *, pool=None, store=None, validation=VALIDATION):
    pool = pool or FakePool(TASKS + VALIDATION)
    config = EvaluationConfig.from_params({"systems": ["solo", "handcrafted"], **params})
    run = asyncio.run(
        evaluate(
            TASKS,
            pool.view(),
            config,
            validation_tasks=validation,
            store=store,
            pool_id="p",
            progress=False,
        )
    )
    return run, {r.question_id: r for r in run.results if r.system == "handcrafted"}


# ---------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------


def test_settings_default_to_auto_and_read_a_mapping_with_a_default():
    settings = EvaluationConfig.from_params({}).settings_of("handcrafted")
    assert settings == HandcraftedSettings(solvers={}, checker="auto")
    assert settings.solver("math") == "auto"
    assert (
        EvaluationConfig.from_params(
            {"handcrafted": {"solvers": "auto", "checker": "auto"}}
        ).settings_of("handcrafted")
        == HandcraftedSettings()
    )
    configured = EvaluationConfig.from_params(
        {"handcrafted": {"solvers": {"math": "mathy", "default": "dud"}, "checker": "ace"}}
    ).settings_of("handcrafted")
    assert configured.checker == "ace"
    assert configured.solver("math") == "mathy" and configured.solver("logic") == "dud"
    only_math = HandcraftedSettings(solvers={"math": "mathy"})
    assert only_math.solver("logic") == "auto"  # no default: the router's pick


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"solvers": 3}, "evaluation.handcrafted.solvers"),
        ({"solvers": ["ace"]}, "evaluation.handcrafted.solvers"),
        ({"solvers": {}}, "evaluation.handcrafted.solvers"),
        ({"solvers": "best"}, "evaluation.handcrafted.solvers"),
        ({"solvers": {"math": ""}}, "evaluation.handcrafted.solvers"),
        ({"solvers": {"math": 1}}, "evaluation.handcrafted.solvers"),
        ({"checker": 5}, "evaluation.handcrafted.checker"),
        ({"checker": ""}, "evaluation.handcrafted.checker"),
        (
            {"checkers": "ace"},
            "evaluation.handcrafted: unknown key 'checkers' \\(did you mean 'checker'",
        ),
    ],
)
def test_bad_settings_name_the_key(section, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        EvaluationConfig.from_params({"handcrafted": section})


def test_it_needs_solo_listed():
    with pytest.raises(ValueError, match=r"evaluation\.systems: handcrafted .* list solo"):
        EvaluationConfig.from_params({"systems": ["handcrafted"]})


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"checker": "nobody"}, "evaluation.handcrafted.checker"),
        ({"solvers": {"math": "nobody"}}, "evaluation.handcrafted.solvers.math"),
        ({"solvers": {"default": "nobody"}}, "evaluation.handcrafted.solvers.default"),
    ],
)
def test_a_worker_not_in_the_pool_is_refused_before_any_call(section, key):
    pool = FakePool(TASKS + VALIDATION)
    with pytest.raises(ValueError, match=key.replace(".", r"\.") + ": no worker named 'nobody'"):
        _evaluate({"handcrafted": section}, pool=pool)
    assert sum(pool.calls.values()) == 0


# ---------------------------------------------------------------------------------------
# The workflow
# ---------------------------------------------------------------------------------------


def test_the_workflow_is_solve_then_check_or_the_solver_alone():
    workflow = handcrafted_workflow(MATH.question, 1, 0)
    assert workflow.workers == [1, 0] and workflow.access_lists == [[], [0]]
    assert workflow.access_pattern() == "chain"
    assert all(MATH.question in s.subtask for s in workflow.steps)  # workers see the question
    assert "attempt" in workflow.steps[1].subtask and "check" in workflow.steps[1].subtask.lower()
    alone = handcrafted_workflow(MATH.question, 2, 2)  # a self-check gains nothing
    assert alone.workers == [2] and alone.access_lists == [[]]


# ---------------------------------------------------------------------------------------
# Through evaluate()
# ---------------------------------------------------------------------------------------


def test_auto_picks_the_strongest_checker_and_the_routers_solver_among_the_others():
    pool = FakePool(TASKS + VALIDATION)
    run, rows = _evaluate({}, pool=pool)
    # checker: ace, the most expensive worker. Solvers, from the validation answers of the
    # others: mathy on maths (right), on logic both wrong and dud the cheaper
    assert run.info["handcrafted"] == {"logic": ["dud", "ace"], "math": ["mathy", "ace"]}
    math = rows[MATH.id]
    assert math.workers == ["mathy", "ace"] and math.n_steps == 2 and math.calls == 2
    assert math.access_pattern == "chain" and math.correct
    assert math.detail["solver"] == "mathy" and math.detail["checker"] == "ace"
    assert math.detail["workflow"]["access_list"] == [[], [0]]
    assert len(math.detail["execution"]["steps"]) == 2
    logic = rows[LOGIC.id]
    assert logic.workers == ["dud", "ace"] and logic.correct  # ace's check fixes dud's answer
    # the checker saw the solver's attempt and the question
    checked = [t for name, t in pool.messages if name == "ace" and MATH.question in t]
    assert len(checked) == 2  # its solo answer and its check
    assert any('<response step="0"' in t and "The answer is 200" in t for t in checked)
    # cost and tokens are the two calls'
    assert math.cost_usd > 0 and math.tokens > 0 and math.cache_hits == 0
    assert not math.infra_failure and math.failed_calls == 0
    # the solo workers ran the validation questions for it (no router listed)
    fitted = {r.system for r in run.results if r.split == "validation"}
    assert fitted == {"solo:ace", "solo:mathy", "solo:dud"}
    assert list(dict.fromkeys(r.system for r in run.results if r.split == "test")) == [
        "solo:ace",
        "solo:mathy",
        "solo:dud",
        "handcrafted",
    ]


def test_the_checker_gives_the_final_answer():
    # dud solves maths (always wrong), ace checks: right
    _, rows = _evaluate({"handcrafted": {"solvers": {"math": "dud"}, "checker": "ace"}})
    assert rows[MATH.id].workers == ["dud", "ace"] and rows[MATH.id].correct
    # mathy solves maths (right), dud checks: dud's own wrong answer is the final one
    _, rows = _evaluate({"handcrafted": {"solvers": {"default": "mathy"}, "checker": "dud"}})
    assert rows[MATH.id].workers == ["mathy", "dud"] and not rows[MATH.id].correct


def test_configured_workers_need_no_validation_answers_and_a_self_check_is_one_step():
    params = {"handcrafted": {"solvers": {"math": "mathy", "default": "ace"}, "checker": "ace"}}
    run, rows = _evaluate(params)
    assert run.info["handcrafted"] == {"logic": ["ace", "ace"], "math": ["mathy", "ace"]}
    assert not [r for r in run.results if r.split == "validation"]
    assert len(rows) == len(TASKS)
    logic = rows[LOGIC.id]
    assert logic.workers == ["ace"] and logic.n_steps == 1 and logic.access_pattern == "single"
    assert logic.calls == 1 and logic.detail["solver"] == logic.detail["checker"] == "ace"


def test_auto_with_the_checker_as_the_only_candidate_runs_it_alone():
    run, rows = _evaluate({"router": {"workers": ["ace"]}})
    assert run.info["handcrafted"] == {"logic": ["ace", "ace"], "math": ["ace", "ace"]}
    assert {r.n_steps for r in rows.values()} == {1}
    # only the router's candidates answered the validation questions
    assert {r.system for r in run.results if r.split == "validation"} == {"solo:ace"}


def test_the_variant_follows_the_choice_and_stored_pairs_are_reused(tmp_path):
    store = tmp_path / "results.jsonl"
    first, rows = _evaluate({}, store=ResultStore(store))
    variant = rows[MATH.id].variant
    assert {r.variant for r in rows.values()} == {variant}
    again, rows = _evaluate({}, store=ResultStore(store))
    assert again.info["pairs_run"] == 0 and rows[MATH.id].variant == variant
    # another checker is another variant: run afresh, not read from the store
    other, rows = _evaluate({"handcrafted": {"checker": "mathy"}}, store=ResultStore(store))
    assert other.info["handcrafted"]["math"] == ["ace", "mathy"]
    assert rows[MATH.id].variant != variant
    assert other.info["pairs_run"] == len(TASKS)
    # a different per-domain choice, from other validation answers, is one as well
    no_validation, rows = _evaluate({}, validation=[])  # the first candidate everywhere
    assert no_validation.info["handcrafted"]["logic"] == ["mathy", "ace"]
    assert rows[MATH.id].variant != variant


def test_it_sorts_after_the_router_and_before_the_oracle():
    assert system_order(["oracle", "handcrafted", "router", "solo:a"]) == [
        "solo:a",
        "router",
        "handcrafted",
        "oracle",
    ]
