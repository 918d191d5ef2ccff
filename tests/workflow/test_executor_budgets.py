"""Budgets bind inside a step: a call is sent ``max_tokens`` capped by what the budget has
left (counting calls in flight), parallel steps do not overshoot, ``stopped_by`` says which
limit stopped the run. Fake callers count tokens as the executor estimates them, so the
arithmetic is exact; no wall-clock assertions."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from conductor_pipeline.workers.types import Usage, WorkerReply
from conductor_pipeline.workflow import PromptConfig, Step, Workflow, execute_workflow
from conductor_pipeline.workflow.budget import (
    Budget,
    WorkerLimits,
    caller_limits,
    estimate_prompt_tokens,
)

CFG = PromptConfig()


def subtask_of(messages) -> str:
    return messages[-1]["content"].rsplit("Your subtask:\n", 1)[1]


class CountingCaller:
    """Reports the estimated prompt tokens (plus ``extra_prompt``) and ``completion`` tokens,
    or the ``max_tokens`` it was sent when that is less; prices each token at ``price``.
    Records the ``max_tokens`` of every call and the start/end order."""

    def __init__(self, completion=50, extra_prompt=0, price=0.0, gates=None, on_start=None):
        self.completion, self.extra_prompt, self.price = completion, extra_prompt, price
        self.caps: list[int | None] = []
        self.events: list[tuple[str, str]] = []
        self.gates, self.on_start = gates or {}, on_start

    async def __call__(self, worker, messages, sample_index=0, **overrides):
        sub = subtask_of(messages)
        cap = overrides.get("max_tokens")
        self.caps.append(cap)
        self.events.append(("start", sub))
        if self.on_start:
            self.on_start(sub)
        if sub in self.gates:
            await asyncio.wait_for(self.gates[sub].wait(), timeout=5)  # a guard, not a timing check
        else:
            await asyncio.sleep(0)
        self.events.append(("end", sub))
        prompt = estimate_prompt_tokens(messages) + self.extra_prompt
        completion = self.completion if cap is None else min(self.completion, cap)
        cost = (prompt + completion) * self.price
        return WorkerReply(f"w{worker}", f"answer to {sub}", Usage(prompt, completion, cost))


def prompt_of(workflow: Workflow, i: int, responses: dict[int, str] | None = None) -> int:
    from conductor_pipeline.workflow.prompts import worker_messages

    return estimate_prompt_tokens(worker_messages("q", workflow, i, responses or {}, CFG))


def parallel(n: int) -> Workflow:
    return Workflow([Step(0, f"s{i}") for i in range(n)])


async def test_max_tokens_1_makes_no_call_and_says_so():
    caller = CountingCaller()
    result = await execute_workflow(
        parallel(3), "q", caller, config=CFG, budget=Budget(max_tokens=1)
    )
    assert caller.caps == [] and result.calls == 0 and result.tokens == 0
    assert result.stopped_by == "max_tokens"
    assert [r.skipped_reason for r in result.steps] == ["max_tokens"] * 3


async def test_a_call_is_capped_at_what_the_budget_has_left():
    wf = Workflow([Step(0, "only")])
    prompt = prompt_of(wf, 0)
    caller = CountingCaller(completion=50)
    limits = [WorkerLimits(max_tokens=50)]
    result = await execute_workflow(
        wf, "q", caller, config=CFG, budget=Budget(max_tokens=prompt + 10), worker_limits=limits
    )
    assert caller.caps == [10] and result.steps[0].completion_cap == 10
    assert result.tokens == prompt + 10
    # the reply filled the cap the budget set: the budget stopped it
    assert result.stopped_by == "max_tokens"


async def test_a_budget_above_the_worker_cap_sends_nothing_extra():
    wf = Workflow([Step(0, "only")])
    caller = CountingCaller(completion=20)
    result = await execute_workflow(
        wf,
        "q",
        caller,
        config=CFG,
        budget=Budget(max_tokens=10_000),
        worker_limits=[WorkerLimits(max_tokens=50)],
    )
    assert caller.caps == [None] and result.steps[0].completion_cap is None
    assert result.stopped_by is None


async def test_parallel_steps_that_fit_run_together_and_the_rest_waits():
    # room for two full calls and part of a third: A and B start together, C waits for
    # them and then gets what is left
    wf = parallel(3)
    prompt = prompt_of(wf, 0)
    both_started = asyncio.Event()
    started: set[str] = set()

    def on_start(sub):
        started.add(sub)
        if {"s0", "s1"} <= started:
            both_started.set()

    caller = CountingCaller(
        completion=50, gates={"s0": both_started, "s1": both_started}, on_start=on_start
    )
    budget = Budget(max_tokens=3 * prompt + 50 + 50 + 20)
    result = await execute_workflow(
        wf, "q", caller, config=CFG, budget=budget, worker_limits=[WorkerLimits(max_tokens=50)]
    )
    ev = caller.events
    first_end = min(ev.index(("end", "s0")), ev.index(("end", "s1")))
    assert ev.index(("start", "s0")) < first_end and ev.index(("start", "s1")) < first_end
    assert ev.index(("start", "s2")) > max(ev.index(("end", "s0")), ev.index(("end", "s1")))
    assert caller.caps == [None, None, 20]
    assert result.tokens == budget.max_tokens and result.stopped_by == "max_tokens"


async def test_parallel_steps_do_not_overshoot():
    # before the fix every parallel step started on the tokens of finished calls (none),
    # and ten steps spent ten times the budget
    wf = parallel(10)
    prompt = prompt_of(wf, 0)
    caller = CountingCaller(completion=50)
    budget = Budget(max_tokens=2 * (prompt + 50) + 5)
    result = await execute_workflow(
        wf, "q", caller, config=CFG, budget=budget, worker_limits=[WorkerLimits(max_tokens=50)]
    )
    assert result.tokens <= budget.max_tokens
    assert result.calls == 2 and result.stopped_by == "max_tokens"
    assert sum(r.skipped_reason == "max_tokens" for r in result.steps) == 8


async def test_overshoot_is_at_most_the_estimate_error_of_the_calls_that_ran():
    # a provider that counts 7 more prompt tokens than estimated: the reply is recorded as it
    # came and the run ends over the limit by no more than that per call
    wf = parallel(4)
    prompt = prompt_of(wf, 0)
    caller = CountingCaller(completion=50, extra_prompt=7)
    budget = Budget(max_tokens=2 * (prompt + 50))
    result = await execute_workflow(
        wf, "q", caller, config=CFG, budget=budget, worker_limits=[WorkerLimits(max_tokens=50)]
    )
    assert result.tokens <= budget.max_tokens + 7 * result.calls
    assert result.steps[0].prompt_tokens == prompt + 7
    assert result.stopped_by == "max_tokens"


async def test_without_a_known_worker_cap_parallel_steps_take_turns():
    # the worker's own cap is unknown, so a call may use all that is left: the next waits
    wf = parallel(2)
    prompt = prompt_of(wf, 0)
    caller = CountingCaller(completion=30)
    budget = Budget(max_tokens=2 * prompt + 100)
    result = await execute_workflow(wf, "q", caller, config=CFG, budget=budget)
    assert caller.events == [("start", "s0"), ("end", "s0"), ("start", "s1"), ("end", "s1")]
    assert caller.caps == [prompt + 100, 70]
    assert result.tokens == 2 * prompt + 60 and result.stopped_by is None


async def test_dollars_cap_the_call_at_known_prices():
    wf = Workflow([Step(0, "only")])
    prompt = prompt_of(wf, 0)
    caller = CountingCaller(completion=500, price=0.001)
    limits = [WorkerLimits(max_tokens=500, prices=(0.001, 0.001))]
    budget = Budget(max_cost_usd=(prompt + 40) * 0.001 + 1e-9)
    result = await execute_workflow(
        wf, "q", caller, config=CFG, budget=budget, worker_limits=limits
    )
    assert caller.caps == [40]
    assert result.cost_usd <= budget.max_cost_usd and result.stopped_by == "max_cost_usd"


async def test_dollars_at_unknown_prices_bind_between_calls():
    caller = CountingCaller(completion=5, price=0.01)
    wf = Workflow([Step(0, f"s{i}", (i - 1,) if i else ()) for i in range(3)])
    result = await execute_workflow(wf, "q", caller, config=CFG, budget=Budget(max_cost_usd=0.01))
    assert caller.caps == [None] and result.calls == 1
    assert result.stopped_by == "max_cost_usd"


async def test_no_budget_sends_no_cap():
    caller = CountingCaller()
    result = await execute_workflow(parallel(2), "q", caller, config=CFG)
    assert caller.caps == [None, None] and result.stopped_by is None


def test_caller_limits_reads_the_pool_behind_wrappers():
    specs = [
        SimpleNamespace(
            max_tokens=64, has_prices=True, input_cost_per_token=1e-6, output_cost_per_token=2e-6
        ),
        SimpleNamespace(max_tokens=None, has_prices=False, model=None),
    ]

    class Pool:
        def __init__(self):
            self.specs = specs

        async def call(self, worker, messages, sample_index=0, **overrides):
            raise AssertionError("not called")

    class Retrying:
        def __init__(self, caller):
            self.caller = caller

    expected = [WorkerLimits(64, (1e-6, 2e-6)), WorkerLimits(None, None)]
    pool = Pool()
    assert caller_limits(pool) == expected
    assert caller_limits(pool.call) == expected
    assert caller_limits(Retrying(SimpleNamespace(inner=pool))) == expected
    assert caller_limits(pool, with_prices=False) == [WorkerLimits(64), WorkerLimits(None)]
    assert caller_limits(object()) is None
