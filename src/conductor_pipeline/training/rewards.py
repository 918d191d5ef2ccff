"""The GRPO reward functions, open-r1 style: plain callables with one signature, and a
registry that builds them by name.

Every reward function has TRL 1.16's signature, sync or async::

    reward(prompts, completions, completion_ids=None, **columns) -> list[float | None]

one value per completion. ``completions`` are texts or conversational lists of messages
(:func:`completion_text` reads either); ``columns`` are the dataset's other columns, one
value per completion, among them the task fields (:func:`task_columns`), plus the
``trainer_state``, ``log_extra`` and ``log_metric`` that TRL adds. ``None`` masks the
completion (see below).

:data:`REWARD_FUNCS` maps a name to a builder that makes the function from a
:class:`RewardContext` (the pool, prompt and reward settings of a training stage);
:func:`get_reward_funcs` builds a list of them by name:

- ``conductor``: :class:`ConductorReward`, the paper's reward, the one training uses: run
  the workflow the completion describes on the worker pool and verify its answer
  (:func:`~conductor_pipeline.training.scoring.score_rollout`);
- ``format``: :func:`format_reward`, 1 when the completion parses as a workflow for the
  pool, else 0; no worker is called (a cheap check of the reply format).

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
import functools
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conductor_pipeline.tasks import Task
from conductor_pipeline.training.configs import RewardConfig
from conductor_pipeline.training.rollout_stats import RolloutStats
from conductor_pipeline.training.scoring import (
    RecursionPolicy,
    RolloutScore,
    score_recursion_round,
    score_rollout,
)
from conductor_pipeline.workers.types import WorkerCaller
from conductor_pipeline.workflow import (
    Budget,
    ParseLimits,
    PromptConfig,
    WorkflowParseError,
    parse_workflow,
    recursion_messages,
)

__all__ = [
    "REWARD_FUNCS",
    "ConductorReward",
    "RewardContext",
    "RewardFunction",
    "ScoredBatch",
    "completion_text",
    "format_reward",
    "get_reward_funcs",
    "task_columns",
]

RewardFunction = Callable[..., "list[float | None] | Awaitable[list[float | None]]"]
"""``reward(prompts, completions, completion_ids=None, **columns) -> list[float | None]``."""


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


# -- the conductor reward ------------------------------------------------------------------------


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
        self.stats = (
            stats if stats is not None else RolloutStats(self.worker_names, self.num_generations)
        )
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
        # the parser reads the whole reply: the prompt's prefill, then what was sampled
        prefill = self.prompt_config.assistant_prefill
        texts = [prefill + completion_text(c) for c in completions]
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


# -- the other reward functions, and the registry ----------------------------------------------


def format_reward(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]] | None = None,
    *,
    n_workers: int,
    prompt_config: PromptConfig,
    **columns: Any,
) -> list[float | None]:
    """1.0 for each completion that parses as a workflow for ``n_workers`` workers (with the
    prompt's step limit and access format, as the conductor reward parses it), else 0.0."""
    limits = ParseLimits(max_steps=prompt_config.max_steps)
    out: list[float | None] = []
    for completion in completions:
        try:
            parse_workflow(
                prompt_config.assistant_prefill + completion_text(completion),
                n_workers,
                limits=limits,
                positional_access=prompt_config.positional_access,
            )
        except WorkflowParseError:
            out.append(0.0)
        else:
            out.append(1.0)
    return out


@dataclass(frozen=True)
class RewardContext:
    """What the reward functions of a training stage are built from (see
    :class:`ConductorReward` for the meaning of each field); a builder takes what it needs."""

    call_worker: WorkerCaller
    worker_names: Sequence[str]
    worker_descriptions: Sequence[str]
    prompt_config: PromptConfig
    reward_config: RewardConfig
    num_generations: int = 1
    budget: Budget | None = None
    prices: Sequence[tuple[float, float] | None] | None = None
    recursion_share: float = 0.0
    recursion_discount: float = 0.25
    stats: RolloutStats | None = None
    on_scores: Callable[[ScoredBatch], None] | None = None


def _conductor(context: RewardContext) -> RewardFunction:
    return ConductorReward(
        context.call_worker,
        context.worker_names,
        context.worker_descriptions,
        context.prompt_config,
        context.reward_config,
        num_generations=context.num_generations,
        budget=context.budget,
        prices=context.prices,
        recursion_share=context.recursion_share,
        recursion_discount=context.recursion_discount,
        stats=context.stats,
        on_scores=context.on_scores,
    )


def _format(context: RewardContext) -> RewardFunction:
    # a partial of a module-level function: TRL names it after the function and can pickle it
    return functools.partial(
        format_reward, n_workers=len(context.worker_names), prompt_config=context.prompt_config
    )


REWARD_FUNCS: dict[str, Callable[[RewardContext], RewardFunction]] = {
    "conductor": _conductor,
    "format": _format,
}


def get_reward_funcs(names: Sequence[str], context: RewardContext) -> list[RewardFunction]:
    """The reward functions named, built for ``context``, in order (TRL sums them, weighted
    by ``reward_weights``).

    ``conductor`` must stand alone: it masks a rollout by returning ``None``, and TRL
    masks a row only when every reward function returns ``None`` for it.
    """
    names = list(names)
    unknown = [name for name in names if name not in REWARD_FUNCS]
    if unknown or not names:
        raise ValueError(
            f"unknown reward function(s) {unknown or names}; expected names among "
            f"{sorted(REWARD_FUNCS)}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"reward functions named twice: {names}")
    if "conductor" in names and len(names) > 1:
        raise ValueError(
            "the conductor reward masks rollouts whose workers failed (it returns None), "
            f"which TRL honours only when every reward function does: use it alone, not {names}"
        )
    return [REWARD_FUNCS[name](context) for name in names]
