"""Scoring one rollout: parse the Conductor's completion, run its workflow (retrying
infrastructure failures), verify the answer; and fold in a forced recursion round.

The reward these functions compute, and why a rollout is masked, are described in
:mod:`conductor_pipeline.training.rewards`, whose reward functions call them. The verdict
-> reward rule is :func:`correctness_reward`, the same in every round. No torch, TRL, Kedro
or MLflow imports here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from conductor_pipeline.tasks import Task, Verdict, verify
from conductor_pipeline.training.configs import RewardConfig
from conductor_pipeline.workers.types import WorkerCaller
from conductor_pipeline.workflow import (
    Budget,
    ExecutionResult,
    ParseLimits,
    PriorStep,
    PromptConfig,
    UnequalListsError,
    WorkflowParseError,
    attempted_steps,
    execute_workflow,
    parse_workflow,
    prior_steps,
    workflow_shape,
)

__all__ = [
    "RecursionPolicy",
    "RolloutScore",
    "correctness_reward",
    "infra_failure",
    "score_recursion_round",
    "score_rollout",
]


@dataclass
class RolloutScore:
    """How one Conductor completion fared.

    ``reward`` is ``None`` when the rollout is masked (infrastructure failure after every
    retry). ``correctness`` is the paper component (``unparseable``/``wrong``/``correct``
    value), ``cost_penalty`` what the cost term subtracted. ``infra_failures`` counts
    failed worker calls over every attempt, ``attempts`` the executions tried.
    ``attempted_steps``: the steps the completion tried to write, parsed or not;
    ``unequal_lists``: it failed only because its lists differ in length. ``domain``
    (the task's) and ``shape`` (:func:`~conductor_pipeline.workflow.workflow_shape` of the
    parsed round-0 workflow) let the training metrics show what the Conductor learns to do
    per domain; ``task_id`` (the task's) which questions a step drew.
    """

    reward: float | None
    correctness: float | None
    cost_penalty: float = 0.0
    parsed: bool = False
    correct: bool = False
    masked: bool = False
    parse_error: str | None = None
    mask_reason: str | None = None
    n_steps: int = 0
    workers: list[int] = field(default_factory=list)
    cost_usd: float = 0.0
    list_cost_usd: float = 0.0
    tokens: int = 0
    calls: int = 0
    cache_hits: int = 0
    infra_failures: int = 0
    attempts: int = 0
    answer: str = ""
    verdict: str | None = None
    execution: ExecutionResult | None = None
    domain: str | None = None
    shape: str | None = None
    task_id: str | None = None
    # how many steps the completion tried to write, parsed or not (0: no model_id list), and
    # whether it failed only because its three lists differ in length
    attempted_steps: int = 0
    unequal_lists: bool = False
    # recursion (filled only when a recursion round was forced)
    recursion_reward: float | None = None
    recursion_kept: bool | None = None


def infra_failure(result: ExecutionResult, *, any_step: bool = False) -> str | None:
    """Why an execution's answer cannot be trusted for scoring, or ``None`` if it can.

    Infrastructure failure = the answer step (the last step) failed, or the run produced
    no answer while some step failed. With ``any_step`` any failed call counts.
    """
    if not result.steps:
        return None
    failed = [s for s in result.steps if s.failure is not None]
    if not failed:
        return None
    last = result.steps[-1]
    if last.failure is not None:
        return f"answer step {last.index} failed: {last.failure}"
    if result.answer_step is None:
        return f"no answer; step {failed[0].index} failed: {failed[0].failure}"
    if any_step:
        return f"step {failed[0].index} failed: {failed[0].failure}"
    return None


def _list_cost(
    result: ExecutionResult, prices: Sequence[tuple[float, float] | None] | None
) -> float:
    """Dollars at list price: cache hits are priced as if the call had been made."""
    total = 0.0
    for step in result.steps:
        if step.started_at is None:
            continue
        price = prices[step.worker] if prices is not None and step.worker < len(prices) else None
        if step.cache_hit and price is not None:
            total += step.prompt_tokens * price[0] + step.completion_tokens * price[1]
        else:
            total += step.cost_usd
    return total


def correctness_reward(verdict: Verdict, config: RewardConfig) -> float:
    """The correctness part of the reward for a verified answer, in every round.

    ``correct`` or ``wrong``; with ``partial_credit`` a wrong answer's fractional score
    (e.g. the share of code tests passed) interpolates between the two.
    """
    if verdict.correct:
        return config.correct
    if config.partial_credit:
        return config.wrong + (config.correct - config.wrong) * float(verdict.score)
    return config.wrong


def _cost_penalty(result: ExecutionResult, list_cost: float, config: RewardConfig) -> float:
    if config.cost_weight == 0:
        return 0.0
    amount = list_cost if config.cost_unit == "usd" else result.tokens / 1000.0
    return config.cost_weight * amount


async def _execute_with_retries(
    workflow: Any,
    question: str,
    call_worker: WorkerCaller,
    *,
    prompt_config: PromptConfig,
    reward_config: RewardConfig,
    budget: Budget | None,
    worker_names: Sequence[str] | None,
    sample_index: int,
    previous_round: Sequence[PriorStep] = (),
) -> tuple[ExecutionResult, str | None, int, int, int]:
    """Execute, retrying on infrastructure failure.

    Returns ``(last result, mask reason or None, attempts, failed calls, calls)``, the
    counts summed over every attempt.
    """
    failed_calls = 0
    calls = 0
    reason: str | None = None
    result: ExecutionResult | None = None
    attempts = 0
    # a loop by hand, not tenacity: the retry depends on the returned result, and the counts
    # of every attempt are summed into what the reward reports
    for attempt in range(reward_config.infra_retries + 1):
        if attempt and reward_config.retry_delay_s > 0:
            await asyncio.sleep(reward_config.retry_delay_s * 2 ** (attempt - 1))
        attempts += 1
        result = await execute_workflow(
            workflow,
            question,
            call_worker,
            config=prompt_config,
            budget=budget,
            worker_names=worker_names,
            sample_index=sample_index,
            previous_round=previous_round,
        )
        failed_calls += result.infra_failures
        calls += result.calls
        reason = infra_failure(result, any_step=reward_config.retry_on_any_failure)
        if reason is None:
            break
    assert result is not None
    return result, reason, attempts, failed_calls, calls


async def score_rollout(
    completion_text: str,
    task: Task,
    call_worker: WorkerCaller,
    n_workers: int,
    worker_names: Sequence[str] | None,
    prompt_config: PromptConfig,
    reward_config: RewardConfig,
    sample_index: int = 0,
    *,
    budget: Budget | None = None,
    prices: Sequence[tuple[float, float] | None] | None = None,
    limits: ParseLimits | None = None,
    allow_empty: bool = False,
) -> RolloutScore:
    """Parse ``completion_text``, execute the workflow for ``task`` and verify the answer.

    ``call_worker(worker_index, messages, sample_index)`` is the pool (any
    ``WorkerCaller``). ``prices`` (dollars per prompt and completion token, per worker)
    price cache hits for the cost term. Never raises for bad completions or worker
    failures; see the module docstring for the reward and the masking rule.
    """
    config = reward_config
    limits = limits or ParseLimits(max_steps=prompt_config.max_steps)
    try:
        # the same access format as the prompt offers and serving accepts
        workflow = parse_workflow(
            completion_text,
            n_workers,
            limits=limits,
            allow_empty=allow_empty,
            positional_access=prompt_config.positional_access,
        )
    except WorkflowParseError as err:
        return RolloutScore(
            reward=config.unparseable,
            correctness=config.unparseable,
            parse_error=str(err),
            domain=task.domain,
            task_id=task.id,
            attempted_steps=attempted_steps(completion_text),
            unequal_lists=isinstance(err, UnequalListsError),
        )

    result, reason, attempts, failed_calls, calls = await _execute_with_retries(
        workflow,
        task.question,
        call_worker,
        prompt_config=prompt_config,
        reward_config=config,
        budget=budget,
        worker_names=worker_names,
        sample_index=sample_index,
    )
    list_cost = _list_cost(result, prices)
    score = RolloutScore(
        reward=None,
        correctness=None,
        parsed=True,
        n_steps=len(workflow),
        workers=list(workflow.workers),
        cost_usd=result.cost_usd,
        list_cost_usd=list_cost,
        tokens=result.tokens,
        calls=calls,
        cache_hits=result.cache_hits,
        infra_failures=failed_calls,
        attempts=attempts,
        answer=result.answer,
        execution=result,
        domain=task.domain,
        task_id=task.id,
        shape=workflow_shape(workflow),
        attempted_steps=len(workflow),
    )
    if reason is not None:
        score.masked = True
        score.mask_reason = reason
        return score

    verdict = await asyncio.to_thread(verify, task, result.answer)
    score.verdict = verdict.reason
    score.correct = bool(verdict.correct)
    value = correctness_reward(verdict, config)
    score.correctness = value
    score.cost_penalty = _cost_penalty(result, list_cost, config)
    score.reward = value - score.cost_penalty
    return score


# -- recursion ---------------------------------------------------------------------------------


class RecursionPolicy(Protocol):
    """Generates the round-1 Conductor completions for a batch of recursion conversations."""

    async def complete_batch(self, conversations: list[list[dict[str, str]]]) -> list[str]: ...


async def score_recursion_round(
    round0: RolloutScore,
    round0_text: str,
    task: Task,
    round1_text: str,
    call_worker: WorkerCaller,
    n_workers: int,
    worker_names: Sequence[str] | None,
    prompt_config: PromptConfig,
    reward_config: RewardConfig,
    discount: float,
    sample_index: int = 0,
    *,
    budget: Budget | None = None,
    prices: Sequence[tuple[float, float] | None] | None = None,
) -> RolloutScore:
    """Fold a forced recursion round into a round-0 score: ``(1-d)·r0 + d·r1``.

    ``r1`` is the correctness value of the answer standing after round 1: the revised
    workflow's answer, or round 0's answer when the Conductor kept it (three empty lists)
    or wrote something unparseable (the orchestrator keeps the answer then, too). Round-1
    costs are added to the cost term. Returns ``round0`` updated in place; a round-1
    infrastructure failure masks the rollout. Only round-0 rollouts that were scored (not
    unparseable, not masked) get a recursion round.
    """
    if round0.reward is None or not round0.parsed:
        return round0
    config = reward_config
    limits = ParseLimits(max_steps=prompt_config.max_steps)
    try:
        revised = parse_workflow(
            round1_text,
            n_workers,
            limits=limits,
            allow_empty=True,
            positional_access=prompt_config.positional_access,
        )
    except WorkflowParseError:
        revised = None
    if revised is None or revised.is_empty:
        round0.recursion_kept = True
        r1 = round0.correctness
    else:
        round0.recursion_kept = False
        # as in serving (orchestrate): round-1 "all" steps also see round 0's steps
        result, reason, attempts, failed, calls = await _execute_with_retries(
            revised,
            task.question,
            call_worker,
            prompt_config=prompt_config,
            reward_config=config,
            budget=budget,
            worker_names=worker_names,
            sample_index=sample_index,
            previous_round=prior_steps(round0.execution) if round0.execution else (),
        )
        round0.attempts += attempts
        round0.infra_failures += failed
        round0.calls += calls
        round0.tokens += result.tokens
        round0.cost_usd += result.cost_usd
        list_cost = _list_cost(result, prices)
        round0.list_cost_usd += list_cost
        if reason is not None:
            round0.masked, round0.mask_reason, round0.reward = True, f"recursion: {reason}", None
            return round0
        verdict = await asyncio.to_thread(verify, task, result.answer)
        r1 = correctness_reward(verdict, config)
        round0.cost_penalty += _cost_penalty(result, list_cost, config)
    assert round0.correctness is not None and r1 is not None
    round0.recursion_reward = r1
    round0.reward = (1 - discount) * round0.correctness + discount * r1 - round0.cost_penalty
    return round0
