"""System kinds: one registered class is a whole new baseline (settings, checks, order, run)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from conductor_pipeline.config_checks import check_int
from conductor_pipeline.evaluation import (
    CONDUCTOR_SYSTEMS,
    SYSTEM_KINDS,
    EvaluationConfig,
    evaluate,
)
from conductor_pipeline.evaluation.metrics import system_order
from conductor_pipeline.evaluation.registry import (
    KINDS,
    SystemKind,
    kind_of,
    register,
)
from conductor_pipeline.evaluation.systems import BestOfNSystem

from .fakes import FakePool, make_tasks


@dataclass(frozen=True)
class CheapestSettings:
    n: int = 3  # samples voted over


class Cheapest(SystemKind):  # the example of docs/evaluation.md, line for line
    name, rank, section, Settings = "cheapest", (6, 1), "cheapest", CheapestSettings

    def systems(self, ctx):
        worker = min(range(len(ctx.pool.names)), key=lambda i: sum(ctx.pool.prices[i] or (0, 0)))
        n = ctx.settings(self.name).n
        return [BestOfNSystem(ctx.pool, worker, n, pool_id=ctx.pool_id, name=self.name)]


class CheckedCheapest(Cheapest):
    """The same with its setting checked (the YAML's types are otherwise taken as they come)."""

    def parse(self, section):
        return CheapestSettings(check_int(section.get("n", 3), "evaluation.cheapest.n", minimum=1))


@pytest.fixture(params=[Cheapest, CheckedCheapest])
def cheapest(request):
    register(request.param)
    yield KINDS["cheapest"]
    del KINDS["cheapest"]


def test_the_built_in_kinds_keep_their_order_and_groups():
    assert SYSTEM_KINDS == (
        "conductor",
        "conductor+recursion",
        "champion",
        "warm-start",
        "base-policy",
        "solo",
        "moa",
        "random-workflow",
        "best-of-n",
        "router",
        "handcrafted",
        "oracle",
    )
    assert SYSTEM_KINDS[:5] == CONDUCTOR_SYSTEMS
    assert kind_of("solo:ace").name == "solo" and kind_of("best-of-n:ace").name == "best-of-n"
    assert kind_of("solo") is None and kind_of("mystery") is None


def test_system_order_follows_the_declared_ranks():
    names = ["oracle", "mystery", "best-of-n:a", "solo:b", "moa", "solo:a", "warm-start"]
    names += ["conductor", "base-policy", "champion", "router", "random-workflow", "handcrafted"]
    assert system_order(names) == [
        "conductor",
        "champion",
        "warm-start",
        "base-policy",
        "solo:b",
        "solo:a",
        "moa",
        "random-workflow",
        "best-of-n:a",
        "router",
        "handcrafted",
        "oracle",
        "mystery",  # no registered kind: last
    ]


def test_a_new_kind_is_listed_checked_and_run_from_its_yaml_entry(cheapest):
    if isinstance(cheapest, CheckedCheapest):
        with pytest.raises(ValueError, match=r"evaluation\.cheapest\.n"):
            EvaluationConfig.from_params({"cheapest": {"n": 0}})
    with pytest.raises(
        ValueError, match=r"evaluation\.cheapest: unknown key 'samples'; known keys: n$"
    ):
        EvaluationConfig.from_params({"cheapest": {"samples": 2}})
    config = EvaluationConfig.from_params({"systems": ["solo", "cheapest"], "cheapest": {"n": 2}})
    assert config.settings_of("cheapest") == CheapestSettings(n=2)
    tasks = make_tasks(2)
    pool = FakePool(tasks)
    out = asyncio.run(evaluate(tasks, pool.view(), config, progress=False))
    order = list(dict.fromkeys(r.system for r in out.results))
    assert order == ["solo:ace", "solo:mathy", "solo:dud", "cheapest"]
    rows = [r for r in out.results if r.system == "cheapest"]
    assert len(rows) == len(tasks) and all(r.workers == ["dud", "dud"] for r in rows)
    assert out.info["pairs_run"] == 4 * len(tasks)  # three solo workers and the new kind


def test_a_kind_that_needs_another_is_refused_alone(cheapest):
    class Needy(SystemKind):
        name, rank, needs, needs_reason = "needy", (9, 0), "cheapest", "needs cheapest as well"

    register(Needy)
    try:
        with pytest.raises(ValueError, match="evaluation.systems: needy needs cheapest as well"):
            EvaluationConfig.from_params({"systems": ["needy"]})
        assert EvaluationConfig.from_params({"systems": ["cheapest", "needy"]}).wants("needy")
    finally:
        del KINDS["needy"]


def test_registration_refuses_a_taken_name_and_an_unknown_phase():
    class Again(SystemKind):
        name, rank = "moa", (0, 0)

    class Odd(SystemKind):
        name, rank, phase = "odd", (0, 0), "later"

    with pytest.raises(ValueError, match="registered already"):
        register(Again)
    with pytest.raises(ValueError, match="phase must be one of"):
        register(Odd)
    assert "odd" not in KINDS
