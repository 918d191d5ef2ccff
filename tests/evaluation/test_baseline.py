"""A new baseline is one class: its name, its settings fields and its answer, registered."""

from __future__ import annotations

import asyncio
import time

import pytest

from conductor_pipeline.config_checks import check_int
from conductor_pipeline.evaluation import EvaluationConfig, evaluate
from conductor_pipeline.evaluation.baseline import Baseline, as_is
from conductor_pipeline.evaluation.metrics import system_order
from conductor_pipeline.evaluation.registry import KINDS, register
from conductor_pipeline.evaluation.systems import majority_vote

from .fakes import FakePool, make_tasks


class Majority(Baseline):
    """Each listed worker ``samples`` times, the most common final answer."""

    name = "majority"
    workers: list[str] | None = None  # None: every worker
    samples: int = 1

    def validate(self) -> None:
        check_int(self.samples, "evaluation.majority.samples", minimum=1)

    async def answer(self, task, split):
        started = time.perf_counter()
        names = self.workers or self.pool.names
        calls = [
            (worker, await self.pool.call(worker, as_is(task.question), sample))
            for worker in map(self.pool.index, names)
            for sample in range(self.samples)
        ]
        chosen, _ = majority_vote([r.text for _, r in calls], task.answer_format)
        answer = calls[chosen][1].text if chosen is not None else ""
        return await self.finish(task, split, calls, answer, started)


@pytest.fixture
def majority():
    register(Majority)
    yield KINDS["majority"]
    del KINDS["majority"]


def _run(params, tasks):
    config = EvaluationConfig.from_params(params)
    return asyncio.run(evaluate(tasks, FakePool(tasks).view(), config, pool_id="p", progress=False))


def test_a_one_class_baseline_is_configured_and_evaluated_by_its_name(majority):
    tasks = make_tasks(2)
    params = {"systems": ["solo", "majority"], "majority": {"workers": ["mathy", "dud"]}}
    out = _run(params, tasks)
    assert list(dict.fromkeys(r.system for r in out.results)) == [
        "solo:ace",
        "solo:mathy",
        "solo:dud",
        "majority",
    ]
    rows = {r.question_id: r for r in out.results if r.system == "majority"}
    assert len(rows) == len(tasks)
    # math: mathy right, dud wrong, a tie the earlier sample wins; logic: neither is right
    assert {qid: row.correct for qid, row in rows.items()} == {
        t.id: t.domain == "math" for t in tasks
    }
    row = rows[tasks[0].id]
    assert row.workers == ["mathy", "dud"] and row.calls == 2 and row.cost_usd > 0
    assert not row.infra_failure and [c["worker_name"] for c in row.detail["calls"]] == [
        "mathy",
        "dud",
    ]
    # another setting is another variant (a resume does not mix their rows)
    again = _run({**params, "majority": {"workers": ["mathy", "dud"], "samples": 2}}, tasks)
    variants = {r.variant for r in again.results if r.system == "majority"}
    assert variants and variants.isdisjoint({r.variant for r in rows.values()})


def test_its_settings_are_its_fields_checked_by_type_and_by_validate(majority):
    assert EvaluationConfig.from_params({}).settings_of("majority") == Majority()
    configured = EvaluationConfig.from_params({"majority": {"samples": 3}})
    assert configured.settings_of("majority") == Majority(samples=3)
    with pytest.raises(ValueError, match=r"evaluation\.majority\.samples: must be int, got 'two'"):
        EvaluationConfig.from_params({"majority": {"samples": "two"}})
    with pytest.raises(ValueError, match=r"evaluation\.majority\.workers: must be list\[str\]"):
        EvaluationConfig.from_params({"majority": {"workers": "ace"}})
    with pytest.raises(ValueError, match=r"evaluation\.majority\.samples"):
        EvaluationConfig.from_params({"majority": {"samples": 0}})
    with pytest.raises(ValueError, match=r"evaluation\.majority: unknown key 'sample'"):
        EvaluationConfig.from_params({"majority": {"sample": 2}})


def test_it_sorts_after_the_built_in_baselines_before_the_oracle(majority):
    names = ["oracle", "majority", "handcrafted", "router", "solo:a", "conductor"]
    assert system_order(names) == [
        "conductor",
        "solo:a",
        "router",
        "handcrafted",
        "majority",
        "oracle",
    ]


def test_a_settings_field_may_not_take_a_kind_attribute_name():
    with pytest.raises(TypeError, match="unannotated"):

        class Named(Baseline):
            name: str = "named"
