"""Orchestration with a scripted Conductor and an in-memory pool: retries, recursion, budgets."""

from __future__ import annotations

import pytest

from conductor_pipeline.workers.types import Usage, WorkerReply
from conductor_pipeline.workflow import (
    Budget,
    OrchestrationConfig,
    PolicyCompletion,
    PromptConfig,
    orchestrate,
)

WORKERS = ["solves arithmetic", "checks answers"]


class ScriptedPolicy:
    """Returns the given completions in order and remembers what it was asked."""

    name = "scripted"

    def __init__(self, *texts: str):
        self.texts = list(texts)
        self.calls: list[tuple[list[dict], int]] = []

    async def complete(self, messages, *, temperature, max_tokens, seed):
        self.calls.append((messages, seed))
        return PolicyCompletion(
            self.texts.pop(0), prompt_tokens=100, completion_tokens=20, latency_s=0.0
        )


class EchoPool:
    """Worker i answers ``w<i>:<n>`` where n counts its calls; costs 1 cent and 10 tokens."""

    def __init__(self):
        self.calls = 0

    async def __call__(self, worker, messages, sample_index=0):
        self.calls += 1
        return WorkerReply(
            worker=f"w{worker}",
            text=f"w{worker}:{self.calls}",
            usage=Usage(prompt_tokens=6, completion_tokens=4, cost_usd=0.01),
        )


def lists(ids, subtasks, access) -> str:
    return f"Thinking it over.\nmodel_id = {ids}\nsubtasks = {subtasks}\naccess_list = {access}"


GOOD = lists([0, 1], ["compute 2+2", "check it"], [[], ["all"]])


async def test_answer_is_last_step_and_record_follows_the_contract():
    result = await orchestrate(
        "2+2?", ScriptedPolicy(GOOD), EchoPool(), WORKERS, worker_names=["a", "b"]
    )
    assert result.answer == "w1:2"
    assert not result.format_failure
    record = result.to_dict()
    assert {"answer", "workflow", "cost_usd", "tokens", "latency_s"} <= set(record)
    assert [step["worker_name"] for step in record["workflow"]] == ["a", "b"]
    assert record["workflow"][1]["access"] == [0]
    assert record["cost_usd"] == pytest.approx(0.02)
    assert record["tokens"] == 20


async def test_parse_failures_resample_with_fresh_seeds_then_succeed():
    policy = ScriptedPolicy(
        "no lists here", "model_id = [7]\nsubtasks = ['x']\naccess_list = [[]]", GOOD
    )
    result = await orchestrate("q", policy, EchoPool(), WORKERS)
    assert result.answer == "w1:2"
    assert [c.parse_error is not None for c in result.conductor_calls] == [True, True, False]
    assert (
        "out of range" in result.conductor_calls[1].parse_error
        or "worker" in result.conductor_calls[1].parse_error
    )
    assert len({seed for _, seed in policy.calls}) == 3


async def test_each_question_draws_its_own_sample_and_reruns_repeat_it():
    """A sampled Conductor must not repeat one random draw on every question: the seed
    depends on the question (and on the configured seed), and is the same on a rerun."""
    questions = [f"question {i}" for i in range(20)]

    async def seeds_for(config: OrchestrationConfig) -> list[int]:
        policy = ScriptedPolicy(*[GOOD] * len(questions))
        for q in questions:
            await orchestrate(q, policy, EchoPool(), WORKERS, config=config)
        return [seed for _, seed in policy.calls]

    first = await seeds_for(OrchestrationConfig())
    assert len(set(first)) == len(questions)
    assert await seeds_for(OrchestrationConfig()) == first
    assert set(await seeds_for(OrchestrationConfig(seed=1))).isdisjoint(first)


async def test_parse_retry_exhaustion_is_a_format_failure_and_calls_no_worker():
    pool = EchoPool()
    config = OrchestrationConfig(max_parse_attempts=3)
    result = await orchestrate(
        "q", ScriptedPolicy("bad", "worse", "[[["), pool, WORKERS, config=config
    )
    assert result.format_failure
    assert result.answer == ""
    assert len(result.conductor_calls) == 3
    assert pool.calls == 0
    assert "3 attempts" in result.rounds[0].note


async def test_recursion_with_empty_workflow_keeps_the_first_answer():
    policy = ScriptedPolicy(GOOD, lists([], [], []))
    result = await orchestrate(
        "q", policy, EchoPool(), WORKERS, config=OrchestrationConfig(max_rounds=1)
    )
    assert result.answer == "w1:2"
    assert result.rounds[-1].kept_previous
    # the recursion prompt shows the Conductor its earlier plan and the answer it produced
    recursion_prompt = " ".join(m["content"] for m in policy.calls[1][0])
    assert "w1:2" in recursion_prompt and "check it" in recursion_prompt


async def test_recursion_with_new_workflow_replaces_the_answer_within_the_remaining_budget():
    pool = EchoPool()
    policy = ScriptedPolicy(GOOD, lists([0, 0], ["redo", "redo again"], [[], []]))
    config = OrchestrationConfig(
        max_rounds=1, budget=Budget(max_steps=3, max_tokens=None, max_cost_usd=None)
    )
    result = await orchestrate("q", policy, pool, WORKERS, config=config)
    assert pool.calls == 3  # two in round 0, one left for round 1
    assert result.rounds[1].execution.stopped_by == "max_steps"
    assert result.answer == "w0:3"


async def test_no_recursion_round_starts_once_the_budget_is_spent():
    # round 0 spends the whole step budget: before the fix the Conductor was still asked for
    # a revision and the response's stopped_by stayed empty
    pool = EchoPool()
    policy = ScriptedPolicy(GOOD, lists([0], ["redo"], [[]]))
    config = OrchestrationConfig(max_rounds=2, budget=Budget(max_steps=2))
    result = await orchestrate("q", policy, pool, WORKERS, config=config)
    assert pool.calls == 2 and len(policy.calls) == 1
    assert result.rounds[0].execution.stopped_by is None
    assert result.rounds[1].execution is None and result.rounds[1].kept_previous
    assert "budget spent (max_steps)" in result.rounds[1].note
    assert result.stopped_by == "max_steps" and result.to_dict()["stopped_by"] == "max_steps"
    assert result.answer == "w1:2"


async def test_a_token_budget_spent_in_round_0_stops_the_recursion():
    pool = EchoPool()  # 10 tokens a call, whatever the prompt
    policy = ScriptedPolicy(GOOD, lists([0], ["redo"], [[]]))
    config = OrchestrationConfig(max_rounds=1, budget=Budget(max_tokens=10_000))
    spent = OrchestrationConfig(max_rounds=1, budget=Budget(max_tokens=20))
    result = await orchestrate("q", policy, EchoPool(), WORKERS, config=config)
    assert result.stopped_by is None and len(result.rounds) == 2
    # at 20 tokens neither step fits its prompt estimate: round 0 skips them, round 1 never starts
    result = await orchestrate("q", ScriptedPolicy(GOOD), pool, WORKERS, config=spent)
    assert pool.calls == 0 and result.stopped_by == "max_tokens"
    assert result.rounds[0].execution.stopped_by == "max_tokens"
    assert result.rounds[1].execution is None and "budget spent" in result.rounds[1].note


async def test_empty_workflow_is_refused_in_the_first_round():
    config = OrchestrationConfig(max_parse_attempts=1)
    result = await orchestrate(
        "q", ScriptedPolicy(lists([], [], [])), EchoPool(), WORKERS, config=config
    )
    assert result.format_failure


async def test_events_report_progress_in_order():
    events = []
    policy = ScriptedPolicy("garbage", GOOD)
    await orchestrate(
        "q", policy, EchoPool(), WORKERS, on_event=lambda kind, payload: events.append(kind)
    )
    assert events == [
        "conductor_output",
        "conductor_output",
        "workflow",
        "step_started",
        "step_finished",
        "step_started",
        "step_finished",
    ]


async def test_a_failing_observer_does_not_break_the_run():
    def explode(kind, payload):
        raise RuntimeError("observer bug")

    result = await orchestrate("q", ScriptedPolicy(GOOD), EchoPool(), WORKERS, on_event=explode)
    assert result.answer == "w1:2"


class RecordingPool(EchoPool):
    """An EchoPool that also keeps the message each call was sent."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    async def __call__(self, worker, messages, sample_index=0):
        self.seen.append(" ".join(m["content"] for m in messages))
        return await super().__call__(worker, messages, sample_index)


async def test_recursion_all_access_also_shows_the_previous_round():
    """The paper's recursion: a round-1 step written with "all" sees round 0's subtasks and
    responses (even as the first step of its round); a step with [] sees none of them."""
    pool = RecordingPool()
    single = lists([1], ["review the earlier attempt"], ["all"])
    mixed = lists([0, 1, 1], ["fresh attempt", "fix the answer", "final"], [[], [], "all"])
    policy = ScriptedPolicy(GOOD, single)
    result = await orchestrate(
        "2+2?", policy, pool, WORKERS, config=OrchestrationConfig(max_rounds=1)
    )
    assert result.answer == "w1:3"
    round0_shown = ("compute 2+2", "check it", "w0:1", "w1:2")
    step0_round1 = pool.seen[2]
    assert all(text in step0_round1 for text in round0_shown), step0_round1

    pool = RecordingPool()
    policy = ScriptedPolicy(GOOD, mixed)
    await orchestrate("2+2?", policy, pool, WORKERS, config=OrchestrationConfig(max_rounds=1))
    fresh, fix, final = pool.seen[2:]
    for text in round0_shown:
        assert text not in fresh and text not in fix  # [] sees nothing, not even round 0
        assert text in final
    # ... and the "all" step still sees this round's earlier steps
    assert "fresh attempt" in final and "fix the answer" in final


async def test_binary_access_refuses_position_lists_and_resamples():
    """With positional_access off (the gpu profile, the paper's main model) a position list
    is a format error naming the entry, not a silently accepted workflow."""
    positional = lists([0, 1, 1], ["a", "b", "c"], [[], [], [0]])
    config = OrchestrationConfig(prompt=PromptConfig(positional_access=False))
    pool = EchoPool()
    result = await orchestrate("q", ScriptedPolicy(positional, GOOD), pool, WORKERS, config=config)
    error = result.conductor_calls[0].parse_error
    assert error is not None and "access_list[2]" in error and "positional_access" in error
    assert result.answer == "w1:2" and pool.calls == 2
    # the same text is fine where the prompt offers position lists (the sandbox default)
    result = await orchestrate("q", ScriptedPolicy(positional), EchoPool(), WORKERS)
    assert result.conductor_calls[0].parse_error is None
