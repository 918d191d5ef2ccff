"""The reward on hand-written completions, with a fake in-process pool (real parse/execute/verify)."""

from __future__ import annotations

import math
import sys

import pytest

from conductor_pipeline.tasks import Task, Verdict
from conductor_pipeline.training.configs import RewardConfig
from conductor_pipeline.training.rewards import ConductorReward, completion_text, task_columns
from conductor_pipeline.training.rollout_stats import RolloutStats, summarise_scores
from conductor_pipeline.training.scoring import (
    RolloutScore,
    correctness_reward,
    score_recursion_round,
    score_rollout,
)
from conductor_pipeline.workers.types import FailureKind
from conductor_pipeline.workflow import PromptConfig

from .fakes import FakePool, make_task, workflow_text

TASK = make_task()
Q = TASK.question
FAST = RewardConfig(retry_delay_s=0.0)


async def score(text: str, pool: FakePool, config: RewardConfig = FAST, **kwargs):
    return await score_rollout(
        text,
        TASK,
        pool,
        len(pool.names),
        pool.names,
        PromptConfig(few_shot=[]),
        config,
        0,
        **kwargs,
    )


async def test_unparseable_scores_zero():
    pool = FakePool([TASK])
    result = await score("I would ask the best worker to do it.", pool)
    assert result.reward == 0.0 and not result.parsed and result.parse_error
    assert sum(pool.calls.values()) == 0


async def test_out_of_range_worker_is_unparseable():
    result = await score(workflow_text([7], [Q], [[]]), FakePool([TASK]))
    assert result.reward == 0.0 and "7" in (result.parse_error or "")


async def test_parseable_but_wrong_scores_half():
    result = await score(workflow_text([1], [Q], [[]]), FakePool([TASK]))
    assert result.parsed and not result.correct and result.reward == 0.5


async def test_question_missing_from_subtask_is_wrong():
    # workers never see the question unless the subtask carries it
    result = await score(workflow_text([0], ["Solve the problem."], [[]]), FakePool([TASK]))
    assert result.reward == 0.5


async def test_correct_scores_one():
    result = await score(workflow_text([0], [Q], [[]]), FakePool([TASK]))
    assert result.correct and result.reward == 1.0
    assert result.n_steps == 1 and result.workers == [0] and result.calls == 1


async def test_two_step_check_fixes_a_wrong_attempt_through_access():
    text = workflow_text([1, 0], [Q, "Check the attempt above."], [[], "all"])
    result = await score(text, FakePool([TASK]))
    assert result.reward == 1.0 and result.n_steps == 2


async def test_configurable_values():
    config = RewardConfig(correct=2.0, wrong=0.25, unparseable=-1.0, retry_delay_s=0)
    pool = FakePool([TASK])
    assert (await score(workflow_text([0], [Q], [[]]), pool, config)).reward == 2.0
    assert (await score(workflow_text([1], [Q], [[]]), pool, config)).reward == 0.25
    assert (await score("nothing", pool, config)).reward == -1.0


@pytest.mark.parametrize(
    "failure", [FailureKind.TIMEOUT, FailureKind.RATE_LIMIT, FailureKind.EMPTY_REPLY]
)
async def test_failed_answer_step_is_retried_then_masked(failure):
    pool = FakePool([TASK], failure=failure)
    config = RewardConfig(infra_retries=2, retry_delay_s=0)
    result = await score(workflow_text([2], [Q], [[]]), pool, config)
    assert result.masked and result.reward is None and result.correctness is None
    assert result.attempts == 3 and pool.calls[2] == 3 and result.infra_failures == 3
    assert failure.value in (result.mask_reason or "")


async def test_transient_failure_is_retried_and_scored():
    pool = FakePool([TASK], flaky={0: 1})
    result = await score(workflow_text([0], [Q], [[]]), pool)
    assert not result.masked and result.reward == 1.0
    assert result.attempts == 2 and result.infra_failures == 1


async def test_answer_step_failure_masks_even_if_an_earlier_step_answered():
    text = workflow_text([0, 2], [Q, "Check it."], [[], "all"])
    result = await score(text, FakePool([TASK]), RewardConfig(infra_retries=1, retry_delay_s=0))
    assert result.masked and result.attempts == 2


async def test_intermediate_failure_with_an_answer_is_scored_unless_configured():
    text = workflow_text([2, 0], ["Say hello.", Q], [[], []])
    pool = FakePool([TASK])
    assert (await score(text, pool)).reward == 1.0
    strict = RewardConfig(retry_on_any_failure=True, infra_retries=1, retry_delay_s=0)
    result = await score(text, FakePool([TASK]), strict)
    assert result.masked and result.attempts == 2


async def test_broken_caller_exception_is_an_infra_failure():
    async def explode(worker, messages, sample_index=0):
        raise ConnectionError("down")

    result = await score_rollout(
        workflow_text([0], [Q], [[]]), TASK, explode, 3, None, PromptConfig(few_shot=[]), FAST
    )
    assert result.masked and "provider_error" in (result.mask_reason or "")


async def test_cost_term_in_dollars_and_tokens():
    pool = FakePool([TASK])
    text = workflow_text([1, 0], [Q, "Check the attempt above."], [[], "all"])
    dollars = RewardConfig(cost_weight=1000.0, retry_delay_s=0)
    result = await score(text, pool, dollars)
    per_call = 10 * 1e-6 + 5 * 2e-6
    assert result.cost_usd == pytest.approx(2 * per_call)
    assert result.reward == pytest.approx(1.0 - 1000.0 * 2 * per_call)
    tokens = RewardConfig(cost_weight=0.1, cost_unit="tokens", retry_delay_s=0)
    result = await score(text, pool, tokens)
    assert result.reward == pytest.approx(1.0 - 0.1 * 30 / 1000)
    off = await score(text, pool)
    assert off.reward == 1.0 and off.cost_penalty == 0.0


async def test_cache_hits_are_priced_at_list_price():
    pool = FakePool([TASK], cache_hits=True)
    config = RewardConfig(cost_weight=1000.0, retry_delay_s=0)
    result = await score(workflow_text([0], [Q], [[]]), pool, config, prices=pool.prices)
    assert result.cost_usd == 0.0
    assert result.list_cost_usd == pytest.approx(10 * 1e-6 + 5 * 2e-6)
    assert result.reward < 1.0


def test_completion_text_forms():
    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "x"}]) == "x"
    assert (
        completion_text([{"role": "assistant", "content": [{"type": "text", "text": "y"}]}]) == "y"
    )


def _columns(tasks: list[Task]) -> dict[str, list]:
    rows = [task_columns(t) for t in tasks]
    return {key: [r[key] for r in rows] for key in rows[0]}


async def test_reward_function_batch_masks_and_bounds_concurrency():
    tasks = [make_task(0), make_task(1, 4, 4)]
    pool = FakePool(tasks, delay_s=0.01)
    config = RewardConfig(max_concurrency=2, infra_retries=1, retry_delay_s=0)
    reward = ConductorReward(
        pool, pool.names, pool.descriptions, PromptConfig(few_shot=[]), config, num_generations=2
    )
    texts = [
        workflow_text([0], [tasks[0].question], [[]]),  # right
        workflow_text([2], [tasks[0].question], [[]]),  # infra → masked
        "no workflow here",  # unparseable
        workflow_text([1], [tasks[1].question], [[]]),  # wrong
    ]
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    batch = [tasks[0], tasks[0], tasks[1], tasks[1]]
    rewards = await reward(
        prompts=[[]] * 4,
        completions=completions,
        completion_ids=[[1, 2, 3]] * 4,
        trainer_state=None,
        log_metric=lambda name, value: None,
        **_columns(batch),
    )
    assert rewards == [1.0, None, 0.0, 0.5]
    assert pool.max_in_flight <= 2
    metrics = reward.stats.drain()
    assert metrics["rollouts/parse_rate"] == pytest.approx(0.75)
    assert metrics["rollouts/masked_rate"] == pytest.approx(0.25)
    assert metrics["rollouts/completion_tokens"] == 12
    assert metrics["reward/mean"] == pytest.approx(0.5)  # over the 3 scored rollouts
    assert metrics["workers/share/sim-good"] == pytest.approx(1 / 3)
    assert metrics["workflow/steps_mean"] == pytest.approx(1.0)
    assert metrics["rollouts/infra_failure_rate"] == pytest.approx(2 / 4)  # 2 of 4 calls failed
    assert reward.stats.drain() == {}


async def test_reward_function_is_async_callable_for_trl():
    from trl.trainer.utils import get_callable_name, is_async_callable

    pool = FakePool([TASK])
    reward = ConductorReward(pool, pool.names, pool.descriptions, PromptConfig(), FAST)
    assert is_async_callable(reward)
    assert get_callable_name(reward) == "conductor_reward"


def test_stats_summary_handles_all_masked():
    stats = RolloutStats(["a"])
    assert stats.drain() == {}


# -- recursion at the reward level ----------------------------------------------------------------


async def _round0(text: str, pool: FakePool):
    return await score(text, pool)


async def test_recursion_keep_leaves_the_reward_unchanged():
    pool = FakePool([TASK])
    r0 = await _round0(workflow_text([1], [Q], [[]]), pool)
    keep = "model_id = []\nsubtasks = []\naccess_list = []"
    out = await score_recursion_round(
        r0, "", TASK, keep, pool, 3, pool.names, PromptConfig(few_shot=[]), FAST, 0.25
    )
    assert out.recursion_kept and out.reward == pytest.approx(0.5)


async def test_recursion_fix_blends_the_rewards():
    pool = FakePool([TASK])
    r0 = await _round0(workflow_text([1], [Q], [[]]), pool)
    fix = workflow_text([0], [Q], [[]])
    out = await score_recursion_round(
        r0, "", TASK, fix, pool, 3, pool.names, PromptConfig(few_shot=[]), FAST, 0.25
    )
    assert not out.recursion_kept and out.recursion_reward == 1.0
    assert out.reward == pytest.approx(0.75 * 0.5 + 0.25 * 1.0)


async def test_recursion_infra_failure_masks():
    pool = FakePool([TASK])
    r0 = await _round0(workflow_text([0], [Q], [[]]), pool)
    broken = workflow_text([2], [Q], [[]])
    config = RewardConfig(infra_retries=0, retry_delay_s=0)
    out = await score_recursion_round(
        r0, "", TASK, broken, pool, 3, pool.names, PromptConfig(few_shot=[]), config, 0.25
    )
    assert out.masked and out.reward is None


class _Policy:
    def __init__(self, text: str) -> None:
        self.text = text
        self.seen: list[list[dict[str, str]]] = []

    async def complete_batch(self, conversations):
        self.seen.extend(conversations)
        return [self.text] * len(conversations)


async def test_reward_function_forces_recursion_on_a_share_of_each_group():
    pool = FakePool([TASK])
    policy = _Policy(workflow_text([0], [Q], [[]]))
    reward = ConductorReward(
        pool,
        pool.names,
        pool.descriptions,
        PromptConfig(few_shot=[]),
        FAST,
        num_generations=4,
        recursion_policy=policy,
        recursion_share=0.5,
        recursion_discount=0.25,
    )
    wrong = workflow_text([1], [Q], [[]])
    rewards = await reward(
        prompts=[[]] * 8,
        completions=[[{"role": "assistant", "content": wrong}]] * 8,
        **_columns([TASK] * 8),
    )
    blended = 0.75 * 0.5 + 0.25 * 1.0
    assert rewards == pytest.approx([blended, blended, 0.5, 0.5] * 2)
    assert len(policy.seen) == 4
    # the round-1 conversation shows the round-0 completion and its answer
    assert policy.seen[0][-2] == {"role": "assistant", "content": wrong}
    assert "The answer is 6" in policy.seen[0][-1]["content"]
    assert math.isclose(reward.stats.drain()["recursion/rate"], 0.5)


# -- what the Conductor learns: answer workers per domain, workflow shapes --------------------


async def test_a_score_carries_its_domain_and_workflow_shape():
    checked = await score(
        workflow_text([1, 0], [Q, "Check the attempt above."], [[], "all"]), FakePool([TASK])
    )
    assert checked.domain == "math" and checked.shape == "solve_check"
    unparsed = await score("no workflow", FakePool([TASK]))
    assert unparsed.domain == "math" and unparsed.shape is None


def _parsed(domain: str, workers: list[int], shape: str) -> RolloutScore:
    return RolloutScore(
        reward=1.0, correctness=1.0, parsed=True, n_steps=len(workers), workers=workers,
        domain=domain, shape=shape,
    )  # fmt: skip


def test_routing_metrics_per_domain_and_shape():
    names = ["sim-good", "sim-bad", "sim-broken"]
    scores = [
        _parsed("math", [1, 0], "solve_check"),  # answer step: sim-good
        _parsed("math", [0], "single"),
        _parsed("math", [1], "single"),
        _parsed("math", [2, 2, 0], "parallel_aggregate"),
        _parsed("code/py", [2], "single"),  # a slash would split the metric name
        RolloutScore(reward=0.0, correctness=0.0, domain="math"),  # unparsed: not counted
    ]
    metrics = summarise_scores(scores, names)
    assert metrics["domain/math/worker/sim-good"] == pytest.approx(3 / 4)
    assert metrics["domain/math/worker/sim-bad"] == pytest.approx(1 / 4)
    assert metrics["domain/math/worker/sim-broken"] == 0.0  # listed, so the curve has no gap
    assert metrics["domain/code_py/worker/sim-broken"] == 1.0
    assert metrics["shape/single"] == pytest.approx(3 / 5)
    assert metrics["shape/solve_check"] == pytest.approx(1 / 5)
    assert metrics["shape/parallel_aggregate"] == pytest.approx(1 / 5)
    assert metrics["shape/chain"] == 0.0 and metrics["shape/other"] == 0.0
    assert metrics["workflow/multi_step_share"] == pytest.approx(2 / 5)
    assert not any(
        k.startswith(("domain/", "shape/")) for k in summarise_scores(scores[-1:], names)
    )


async def test_the_reward_function_reports_routing_per_domain():
    tasks = [make_task(0), make_task(1, 4, 4, domain="logic")]
    pool = FakePool(tasks)
    reward = ConductorReward(
        pool, pool.names, pool.descriptions, PromptConfig(few_shot=[]), FAST, num_generations=2
    )
    texts = [
        workflow_text([0], [tasks[0].question], [[]]),
        workflow_text([1, 0], [tasks[0].question, "Check it."], [[], "all"]),
        workflow_text([1], [tasks[1].question], [[]]),
        "not a workflow",
    ]
    await reward(
        prompts=[[]] * 4,
        completions=[[{"role": "assistant", "content": t}] for t in texts],
        **_columns([tasks[0], tasks[0], tasks[1], tasks[1]]),
    )
    metrics = reward.stats.drain()
    assert metrics["domain/math/worker/sim-good"] == 1.0
    assert metrics["domain/logic/worker/sim-bad"] == 1.0  # of the one parsed logic rollout
    assert metrics["shape/single"] == pytest.approx(2 / 3)
    assert metrics["workflow/multi_step_share"] == pytest.approx(1 / 3)


async def test_recursion_all_step_sees_round_zero_as_in_serving():
    # round 1's only step does not restate the question: it can solve it only because "all"
    # shows it round 0's subtask (which holds the question), as orchestrate does in serving
    pool = FakePool([TASK])
    r0 = await _round0(workflow_text([1], [Q], [[]]), pool)
    review = workflow_text([0], ["Redo the earlier attempt correctly."], ["all"])
    out = await score_recursion_round(
        r0, "", TASK, review, pool, 3, pool.names, PromptConfig(few_shot=[]), FAST, 0.25
    )
    assert out.recursion_reward == 1.0


async def test_binary_access_prompt_scores_position_lists_as_unparseable():
    text = workflow_text([1, 0], [Q, "Check the attempt above."], [[], [0]])
    binary = PromptConfig(few_shot=[], positional_access=False)
    result = await score_rollout(text, TASK, FakePool([TASK]), 3, None, binary, FAST)
    assert result.reward == 0.0 and "positional_access" in (result.parse_error or "")


# -- the verdict -> reward rule, the same in every round ----------------------------------------


def test_correctness_reward_of_a_verdict():
    right = Verdict(True, 1.0, "5", "matches")
    wrong = Verdict(False, 0.4, "x", "2 of 5 tests pass")
    assert correctness_reward(right, FAST) == 1.0
    assert correctness_reward(wrong, FAST) == 0.5
    partial = RewardConfig(partial_credit=True, retry_delay_s=0.0)
    assert correctness_reward(right, partial) == 1.0
    assert correctness_reward(wrong, partial) == pytest.approx(0.5 + 0.5 * 0.4)


@pytest.fixture
def wrong_answers_pass_some_checks(monkeypatch):
    # as a code answer that passes 2 of 5 tests: wrong, with a fractional score
    module = sys.modules[score_rollout.__module__]
    real = module.verify

    def verify(task, answer):
        verdict = real(task, answer)
        return verdict if verdict.correct else Verdict(False, 0.4, verdict.extracted, "2 of 5")

    monkeypatch.setattr(module, "verify", verify)


async def test_partial_credit_counts_in_round_zero_and_in_recursion_rounds(
    wrong_answers_pass_some_checks,
):
    partial = RewardConfig(partial_credit=True, retry_delay_s=0.0)
    wrong = workflow_text([1], [Q], [[]])
    assert (await score(wrong, FakePool([TASK]), partial)).correctness == pytest.approx(0.7)
    pool = FakePool([TASK])
    r0 = await score(workflow_text([0], [Q], [[]]), pool, partial)
    assert r0.correctness == 1.0
    out = await score_recursion_round(
        r0, "", TASK, wrong, pool, 3, pool.names, PromptConfig(few_shot=[]), partial, 0.25
    )
    assert not out.recursion_kept and out.recursion_reward == pytest.approx(0.7)
    assert out.reward == pytest.approx(0.75 * 1.0 + 0.25 * 0.7)


# -- what the Conductor tries, and what trying pays --------------------------------------------


async def test_a_failed_score_says_what_it_attempted():
    unequal = await score(
        "model_id = [1, 0]\nsubtasks = ['Solve it.']\naccess_list = [[], 'all']", FakePool([TASK])
    )
    assert not unequal.parsed and unequal.unequal_lists and unequal.attempted_steps == 2
    garbled = await score("model_id = [0, 1, 2]\nsubtasks = ['a', 'b', 'c']", FakePool([TASK]))
    assert garbled.attempted_steps == 3 and not garbled.unequal_lists
    assert (await score("no workflow", FakePool([TASK]))).attempted_steps == 0
    parsed = await score(workflow_text([1, 0], [Q, "Check."], [[], "all"]), FakePool([TASK]))
    assert parsed.attempted_steps == 2 and not parsed.unequal_lists


def _attempt(steps: int, reward: float | None, *, unequal: bool = False) -> RolloutScore:
    return RolloutScore(
        reward=reward, correctness=reward, parsed=not unequal and steps > 0, n_steps=steps,
        attempted_steps=steps, unequal_lists=unequal, masked=reward is None,
    )  # fmt: skip


def test_multi_step_attempts_and_their_reward_gap_per_group():
    stats = RolloutStats(["a", "b"], group_size=4)
    group_1 = [_attempt(1, 0.5), _attempt(1, 1.0), _attempt(2, 1.0), _attempt(2, 0.0, unequal=True)]
    group_2 = [_attempt(1, 1.0), _attempt(3, 1.0), _attempt(0, 0.0), _attempt(2, None)]
    group_3 = [_attempt(1, 0.5)] * 4  # no multi-step attempt: no gap to take
    stats.add(group_1 + group_2)
    stats.add(group_3)
    metrics = stats.drain()
    assert metrics["rollouts/multi_step_attempt_share"] == pytest.approx(4 / 12)
    assert metrics["rollouts/unequal_lists_rate"] == pytest.approx(1 / 12)
    # group 1: 0.5 - 0.75; group 2: 1.0 - 1.0 (the masked attempt does not count)
    assert metrics["reward/multi_minus_single"] == pytest.approx((-0.25 + 0.0) / 2)
    stats.add(group_3)
    assert "reward/multi_minus_single" not in stats.drain()
    # a batch that is not whole groups adds rollouts but no group
    stats.add(group_1[:3])
    assert "reward/multi_minus_single" not in stats.drain()


async def test_scores_name_their_task_and_stats_count_the_curriculum_draw():
    parsed = await score(workflow_text([0], [Q], [[]]), FakePool([TASK]))
    unparsed = await score("no workflow", FakePool([TASK]))
    assert parsed.task_id == unparsed.task_id == TASK.id
    drawn = [RolloutScore(reward=1.0, correctness=1.0, task_id=t) for t in "aabbccdd"]
    stats = RolloutStats(["w"], group_size=2, unsolved={"b", "z"})
    stats.add(drawn)
    assert stats.drain()["curriculum/unsolved_share"] == pytest.approx(2 / 8)
    stats.add(drawn[2:4])  # a step of such questions only
    assert stats.drain()["curriculum/unsolved_share"] == 1.0
    without = RolloutStats(["w"], group_size=2)  # no curriculum: no such metric
    without.add(drawn)
    assert "curriculum/unsolved_share" not in without.drain()
