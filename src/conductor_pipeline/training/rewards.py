"""The GRPO reward: run the workflow a Conductor completion describes and check its answer.

Core: :func:`score_rollout` (one completion) and :class:`ConductorReward` (a TRL reward
function over a batch). No torch, TRL, Kedro or MLflow imports here.

Reward (the paper's, values configurable in :class:`RewardConfig`):

- ``unparseable`` (0) when the completion is not a valid workflow;
- ``wrong`` (0.5) when it parses, runs, and the final answer is wrong;
- ``correct`` (1) when the final answer is right;
- minus ``cost_weight * cost`` when the optional cost term is on (off by default).

**Infrastructure failures are not wrong answers.** A rollout whose answer step failed
(timeout, rate limit, provider error, empty or malformed reply), or whose workflow ended
with no answer because some step failed, is executed again up to
``RewardConfig.infra_retries`` times. Steps that succeeded are normally served from the
pool's response cache on a retry (same ``sample_index``), so a retry re-pays only the
failed calls. If it still fails, the rollout is **masked**: its reward is ``None``.

What TRL 1.16 does with ``None`` (read from ``trl/trainer/grpo_trainer.py``,
``_calculate_rewards`` and ``_generate_and_score_completions``): ``None`` becomes NaN; a
row where *every* reward function returned NaN is "unscorable"; its summed reward is set
back to NaN (``nansum`` alone would have made it 0), so the group mean and standard
deviation are taken with ``nanmean``/``nanstd`` over the valid rollouts only, and
``torch.nan_to_num`` then sets the masked rollout's advantage to exactly 0. Every policy
loss TRL offers multiplies the per-token term by the advantage, so the masked completion's
policy-gradient contribution is exactly zero and it does not shift its group's baseline.
(Its tokens still count in the ``dapo``/``bnpo`` length normaliser, a uniform rescaling of
the step's gradient, and with ``beta > 0`` its KL term still applies; both configs use
``beta = 0``.) This only holds when *all* reward functions return ``None`` for the row,
which is why the Conductor uses a single reward function that folds the cost term in.
``tests/training/test_grpo.py`` checks the zero advantage inside a real TRL step.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from conductor_pipeline.tasks import Task, Verdict, verify
from conductor_pipeline.training.configs import RewardConfig
from conductor_pipeline.workers.types import WorkerCaller
from conductor_pipeline.workflow import (
    SHAPES,
    Budget,
    ExecutionResult,
    ParseLimits,
    PriorStep,
    PromptConfig,
    WorkflowParseError,
    execute_workflow,
    parse_workflow,
    prior_steps,
    recursion_messages,
    workflow_shape,
)

__all__ = [
    "ConductorReward",
    "RecursionPolicy",
    "RolloutScore",
    "RolloutStats",
    "ScoredBatch",
    "completion_text",
    "correctness_reward",
    "infra_failure",
    "routing_metrics",
    "score_rollout",
]


@dataclass
class RolloutScore:
    """How one Conductor completion fared.

    ``reward`` is ``None`` when the rollout is masked (infrastructure failure after every
    retry). ``correctness`` is the paper component (``unparseable``/``wrong``/``correct``
    value), ``cost_penalty`` what the cost term subtracted. ``infra_failures`` counts
    failed worker calls over every attempt, ``attempts`` the executions tried. ``domain``
    (the task's) and ``shape`` (:func:`~conductor_pipeline.workflow.workflow_shape` of the
    parsed round-0 workflow) let the training metrics show what the Conductor learns to do
    per domain.
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
    # recursion (filled only when a recursion round was forced)
    recursion_reward: float | None = None
    recursion_kept: bool | None = None


def completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string, or a conversational list of messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion:
        last = completion[-1]
        if isinstance(last, Mapping):
            content = last.get("content", "")
            if isinstance(content, list):  # content blocks
                return "".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping))
            return str(content or "")
    return ""


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
        shape=workflow_shape(workflow),
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


# -- batch statistics ----------------------------------------------------------------------------


class RolloutStats:
    """Accumulates rollout scores between two reads (thread-safe enough for one writer).

    ``drain()`` returns averaged metrics since the previous drain, names ready for MLflow:
    ``reward/mean``, ``reward/std``, ``reward/correctness_mean``, ``reward/cost_penalty_mean``,
    ``rollouts/parse_rate``, ``rollouts/accuracy`` (of scored rollouts),
    ``rollouts/masked_rate``, ``rollouts/infra_failure_rate`` (failed calls / calls),
    ``rollouts/retries_per_rollout``, ``workflow/steps_mean``, ``workflow/cost_usd_mean``,
    ``workflow/tokens_mean``, ``workflow/cache_hit_rate``, ``workers/share/<name>``,
    ``rollouts/completion_tokens`` (total, for tokens/s) and ``rollouts/score_seconds``
    (wall time spent executing and verifying workflows). What the Conductor learns to do,
    over the parsed rollouts: ``domain/<domain>/worker/<name>`` (share of that domain's
    rollouts whose answer step, the last, went to the worker), ``shape/<shape>`` (share of
    each workflow shape) and ``workflow/multi_step_share``.
    """

    def __init__(self, worker_names: Sequence[str] | None = None) -> None:
        self.worker_names = list(worker_names or [])
        self._scores: list[RolloutScore] = []
        self.completion_tokens = 0
        self.score_seconds = 0.0
        self.total_rollouts = 0

    def add(
        self, scores: Sequence[RolloutScore], completion_tokens: int = 0, seconds: float = 0.0
    ) -> None:
        self._scores.extend(scores)
        self.completion_tokens += int(completion_tokens)
        self.score_seconds += float(seconds)
        self.total_rollouts += len(scores)

    def drain(self) -> dict[str, float]:
        scores, self._scores = self._scores, []
        tokens, self.completion_tokens = self.completion_tokens, 0
        seconds, self.score_seconds = self.score_seconds, 0.0
        metrics = summarise_scores(scores, self.worker_names, completion_tokens=tokens)
        if metrics:
            metrics["rollouts/score_seconds"] = seconds
        return metrics


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0 if values else float("nan")
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def summarise_scores(
    scores: Sequence[RolloutScore],
    worker_names: Sequence[str] | None = None,
    *,
    completion_tokens: int = 0,
) -> dict[str, float]:
    """Aggregate metrics over ``scores`` (see :class:`RolloutStats`); empty input → ``{}``."""
    if not scores:
        return {}
    n = len(scores)
    valid = [s for s in scores if s.reward is not None]
    parsed = [s for s in scores if s.parsed]
    executed = [s for s in parsed if not s.masked]
    calls = sum(s.calls for s in parsed)
    usage: Counter[int] = Counter(w for s in parsed for w in s.workers)
    total_steps = sum(usage.values())
    metrics: dict[str, float] = {
        "reward/mean": _mean([s.reward for s in valid]),  # type: ignore[misc]
        "reward/std": _std([s.reward for s in valid]),  # type: ignore[misc]
        "reward/correctness_mean": _mean([s.correctness for s in valid]),  # type: ignore[misc]
        "reward/correctness_std": _std([s.correctness for s in valid]),  # type: ignore[misc]
        "reward/cost_penalty_mean": _mean([s.cost_penalty for s in valid]),
        "reward/cost_penalty_std": _std([s.cost_penalty for s in valid]),
        "rollouts/n": float(n),
        "rollouts/parse_rate": len(parsed) / n,
        "rollouts/accuracy": _mean([1.0 if s.correct else 0.0 for s in executed]),
        "rollouts/masked_rate": sum(1 for s in scores if s.masked) / n,
        "rollouts/infra_failure_rate": (sum(s.infra_failures for s in parsed) / calls)
        if calls
        else 0.0,
        "rollouts/retries_per_rollout": _mean([max(s.attempts - 1, 0) for s in parsed])
        if parsed
        else 0.0,
        "workflow/steps_mean": _mean([s.n_steps for s in parsed]),
        "workflow/cost_usd_mean": _mean([s.cost_usd for s in parsed]),
        "workflow/list_cost_usd_mean": _mean([s.list_cost_usd for s in parsed]),
        "workflow/tokens_mean": _mean([s.tokens for s in parsed]),
        "workflow/calls_mean": _mean([s.calls for s in parsed]),
        "workflow/cache_hit_rate": (sum(s.cache_hits for s in parsed) / calls) if calls else 0.0,
        "rollouts/completion_tokens": float(completion_tokens),
    }
    recursed = [s for s in valid if s.recursion_reward is not None]
    if recursed:
        metrics["recursion/rate"] = len(recursed) / n
        metrics["recursion/kept_rate"] = _mean([1.0 if s.recursion_kept else 0.0 for s in recursed])
        metrics["recursion/r1_mean"] = _mean([s.recursion_reward for s in recursed])  # type: ignore[misc]
    names = list(worker_names or [])
    for index in sorted(set(usage) | set(range(len(names)))):
        label = names[index] if index < len(names) else str(index)
        metrics[f"workers/share/{label}"] = usage[index] / total_steps if total_steps else 0.0
    metrics.update(routing_metrics(parsed, names))
    return {k: v for k, v in metrics.items() if not (isinstance(v, float) and math.isnan(v))}


def _metric_part(text: str) -> str:
    """A domain name as one MLflow metric-name segment (no slash, only allowed characters)."""
    return re.sub(r"[^\w\-. ]", "_", text) or "_"


def routing_metrics(
    parsed: Sequence[RolloutScore], worker_names: Sequence[str]
) -> dict[str, float]:
    """Answer-worker shares per domain, shape shares and the multi-step share of the parsed
    rollouts ``parsed`` (see :class:`RolloutStats`); every worker and shape is listed, with
    0 when unused, so each curve is continuous over training. Empty input → ``{}``."""
    if not parsed:
        return {}
    names = list(worker_names)
    metrics: dict[str, float] = {
        "workflow/multi_step_share": sum(1 for s in parsed if s.n_steps > 1) / len(parsed)
    }
    shapes = Counter(s.shape for s in parsed)
    for shape in SHAPES:
        metrics[f"shape/{shape}"] = shapes.get(shape, 0) / len(parsed)
    by_domain: dict[str, list[RolloutScore]] = {}
    for score in parsed:
        if score.domain is not None:
            by_domain.setdefault(score.domain, []).append(score)
    for domain, scores in sorted(by_domain.items()):
        answered = Counter(s.workers[-1] for s in scores if s.workers)
        for index in sorted(set(answered) | set(range(len(names)))):
            label = names[index] if index < len(names) else str(index)
            key = f"domain/{_metric_part(domain)}/worker/{label}"
            metrics[key] = answered.get(index, 0) / len(scores)
    return metrics


# -- the TRL reward function ------------------------------------------------------------------------


_TASK_FIELDS = tuple(Task.__dataclass_fields__)


def task_columns(task: Task) -> dict[str, Any]:
    """The dataset columns that carry a task to the reward function (``Task.to_record``)."""
    return task.to_record()


def _task_from_columns(columns: Mapping[str, Sequence[Any]], i: int) -> Task:
    row = {name: columns[name][i] for name in _TASK_FIELDS if name in columns}
    missing = [name for name in _TASK_FIELDS if name not in row and name != "metadata"]
    if missing:
        raise KeyError(
            f"the reward function needs the task columns {list(_TASK_FIELDS)}; missing {missing}"
        )
    metadata = row.get("metadata")
    if isinstance(metadata, str):
        row["metadata"] = json.loads(metadata) if metadata else {}
    return Task.from_record(row)


@dataclass
class ScoredBatch:
    """What ``ConductorReward.on_scores`` receives after each batch; ``step`` is the
    optimizer step being computed (``trainer_state.global_step + 1``) when TRL passes it."""

    step: int | None
    texts: list[str]
    tasks: list[Task]
    scores: list[RolloutScore]


class ConductorReward:
    """The GRPO reward function (TRL 1.16 calling convention)::

        await reward(prompts, completions, completion_ids=None, **columns) -> list[float | None]

    ``columns`` are the dataset's other columns, one value per completion; the task fields
    (``Task.to_record()``: ``id``, ``domain``, ..., ``metadata`` as JSON) must be among them.
    TRL also passes ``trainer_state``, ``log_extra`` and ``log_metric``; they are accepted
    and ignored (metrics go to ``self.stats``, read by the training callback).

    Rollouts of the batch run concurrently, at most ``max_concurrency`` at a time. The
    ``sample_index`` of a rollout is its position within its group (``i %
    num_generations``), so identical workflows in a group draw independent worker samples,
    while the cache still serves them again in later steps.

    With ``recursion_policy`` and ``recursion_share > 0``, the first ``share`` of every
    group also gets a forced recursion round (see :func:`score_recursion_round`).
    ``on_scores`` is called with a :class:`ScoredBatch` after every batch (sample logging).
    """

    __name__ = "conductor_reward"

    def __init__(
        self,
        call_worker: WorkerCaller,
        worker_names: Sequence[str],
        worker_descriptions: Sequence[str],
        prompt_config: PromptConfig,
        reward_config: RewardConfig,
        *,
        num_generations: int = 1,
        budget: Budget | None = None,
        prices: Sequence[tuple[float, float] | None] | None = None,
        recursion_policy: RecursionPolicy | None = None,
        recursion_share: float = 0.0,
        recursion_discount: float = 0.25,
        stats: RolloutStats | None = None,
        on_scores: Callable[[ScoredBatch], None] | None = None,
    ) -> None:
        self.call_worker = call_worker
        self.worker_names = list(worker_names)
        self.worker_descriptions = list(worker_descriptions)
        self.prompt_config = prompt_config
        self.reward_config = reward_config
        self.num_generations = max(int(num_generations), 1)
        self.budget = budget
        self.prices = list(prices) if prices is not None else None
        self.recursion_policy = recursion_policy
        self.recursion_share = recursion_share
        self.recursion_discount = recursion_discount
        self.stats = stats if stats is not None else RolloutStats(self.worker_names)
        self.on_scores = on_scores
        self._semaphores: dict[int, asyncio.Semaphore] = {}
        self.last_scores: list[RolloutScore] = []

    @property
    def n_workers(self) -> int:
        return len(self.worker_names)

    def _semaphore(self) -> asyncio.Semaphore:
        # one per event loop: TRL awaits rewards on its own background loop, tests on theirs
        loop = asyncio.get_running_loop()
        key = id(loop)
        if key not in self._semaphores:
            self._semaphores = {key: asyncio.Semaphore(self.reward_config.max_concurrency)}
        return self._semaphores[key]

    def _recursion_rows(self, n: int) -> list[int]:
        if self.recursion_policy is None or self.recursion_share <= 0:
            return []
        per_group = max(1, round(self.recursion_share * self.num_generations))
        return [i for i in range(n) if i % self.num_generations < per_group]

    async def _score_one(self, text: str, task: Task, sample_index: int) -> RolloutScore:
        async with self._semaphore():
            return await score_rollout(
                text,
                task,
                self.call_worker,
                self.n_workers,
                self.worker_names,
                self.prompt_config,
                self.reward_config,
                sample_index,
                budget=self.budget,
                prices=self.prices,
            )

    async def _recurse(
        self, rows: list[int], texts: list[str], tasks: list[Task], scores: list[RolloutScore]
    ) -> None:
        rows = [i for i in rows if scores[i].reward is not None and scores[i].parsed]
        if not rows:
            return
        conversations = [
            recursion_messages(
                tasks[i].question,
                self.worker_descriptions,
                texts[i],
                scores[i].answer,
                self.prompt_config,
            )
            for i in rows
        ]
        assert self.recursion_policy is not None
        revisions = await self.recursion_policy.complete_batch(conversations)

        async def fold(i: int, revision: str) -> None:
            async with self._semaphore():
                await score_recursion_round(
                    scores[i],
                    texts[i],
                    tasks[i],
                    revision,
                    self.call_worker,
                    self.n_workers,
                    self.worker_names,
                    self.prompt_config,
                    self.reward_config,
                    self.recursion_discount,
                    sample_index=i % self.num_generations,
                    budget=self.budget,
                    prices=self.prices,
                )

        await asyncio.gather(*(fold(i, r) for i, r in zip(rows, revisions, strict=True)))

    async def score_batch(self, texts: Sequence[str], tasks: Sequence[Task]) -> list[RolloutScore]:
        """Score a batch of completion texts (group-contiguous, as TRL orders them)."""
        texts, tasks = list(texts), list(tasks)
        scores = await asyncio.gather(
            *(
                self._score_one(text, task, i % self.num_generations)
                for i, (text, task) in enumerate(zip(texts, tasks, strict=True))
            )
        )
        scores = list(scores)
        recursion_rows = self._recursion_rows(len(texts))
        if recursion_rows:
            await self._recurse(recursion_rows, texts, tasks, scores)
        return scores

    async def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        started = time.perf_counter()
        texts = [completion_text(c) for c in completions]
        tasks = [_task_from_columns(columns, i) for i in range(len(texts))]
        scores = await self.score_batch(texts, tasks)
        n_tokens = sum(len(ids) for ids in completion_ids) if completion_ids is not None else 0
        self.stats.add(scores, completion_tokens=n_tokens, seconds=time.perf_counter() - started)
        self.last_scores = scores
        if self.on_scores is not None:
            state = columns.get("trainer_state")
            step = int(state.global_step) + 1 if state is not None else None
            self.on_scores(ScoredBatch(step, texts, tasks, scores))
        return [s.reward for s in scores]
