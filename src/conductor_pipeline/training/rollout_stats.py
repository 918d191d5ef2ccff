"""Metrics over scored rollouts: what :class:`RolloutStats` hands the training callback
after each logging step (reward, parse rate, accuracy, masking, cost, routing)."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from collections import Counter
from collections.abc import Collection, Sequence

from conductor_pipeline.training.scoring import RolloutScore
from conductor_pipeline.workflow import SHAPES

__all__ = [
    "RolloutStats",
    "gather_from_processes",
    "multi_step_gap",
    "routing_metrics",
    "summarise_scores",
]


def gather_from_processes(value: object) -> list[object]:
    """``value`` of every process of the running ``torch.distributed`` group, in rank
    order (every process must call it); ``[value]`` when there is no group of two or
    more. Without torch imported there can be no group, so torch is not imported here."""
    torch = sys.modules.get("torch")
    if torch is None:
        return [value]
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return [value]
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


class RolloutStats:
    """Accumulates rollout scores between two reads (thread-safe enough for one writer).

    ``drain()`` returns averaged metrics since the previous drain, names ready for MLflow:
    ``reward/mean``, ``reward/std``, ``reward/correctness_mean``, ``reward/cost_penalty_mean``,
    ``rollouts/parse_rate``, ``rollouts/accuracy`` (of scored rollouts),
    ``rollouts/masked_rate``, ``rollouts/infra_failure_rate`` (failed calls / calls),
    ``rollouts/retries_per_rollout``, ``workflow/steps_mean``, ``workflow/cost_usd_mean``,
    ``workflow/cost_usd_sum`` (dollars paid for all of them), ``workflow/tokens_mean``,
    ``workflow/cache_hit_rate``, ``workers/share/<name>``,
    ``rollouts/completion_tokens`` (total, for tokens/s) and ``rollouts/score_seconds``
    (wall time spent executing and verifying workflows). What the Conductor learns to do,
    over the parsed rollouts: ``domain/<domain>/worker/<name>`` (share of that domain's
    rollouts whose answer step, the last, went to the worker), ``shape/<shape>`` (share of
    each workflow shape) and ``workflow/multi_step_share``. What it tries, over every
    rollout, parsed or not: ``rollouts/multi_step_attempt_share`` and
    ``rollouts/unequal_lists_rate``; and what trying pays: ``reward/multi_minus_single``
    (:func:`multi_step_gap`, over the groups of ``group_size`` consecutive rollouts).
    With ``unsolved`` (the ids of the questions the curriculum's reference worker got wrong),
    ``curriculum/unsolved_share``: the share of the rollouts that were of such a question,
    so a run shows the share each step drew, not only the one it asked for.

    Several processes (``torch.distributed`` initialised): each process scores its share of
    a step's rollouts, and ``drain()``, which every process calls, gathers all the shares
    first, so every process returns the metrics of the whole step.
    """

    def __init__(
        self,
        worker_names: Sequence[str] | None = None,
        group_size: int = 1,
        unsolved: Collection[str] | None = None,
    ) -> None:
        self.worker_names = list(worker_names or [])
        self.group_size = max(int(group_size), 1)
        self.unsolved = frozenset(unsolved) if unsolved is not None else None
        self._scores: list[RolloutScore] = []
        self._groups: list[list[RolloutScore]] = []
        self.completion_tokens = 0
        self.score_seconds = 0.0
        self.total_rollouts = 0

    def add(
        self, scores: Sequence[RolloutScore], completion_tokens: int = 0, seconds: float = 0.0
    ) -> None:
        """One reward batch, in TRL's order: ``group_size`` rollouts of a prompt together.
        A batch that is not whole groups (a process's share of a split group) adds no group."""
        self._scores.extend(scores)
        if len(scores) % self.group_size == 0:
            size = self.group_size
            self._groups += [list(scores[i : i + size]) for i in range(0, len(scores), size)]
        self.completion_tokens += int(completion_tokens)
        self.score_seconds += float(seconds)
        self.total_rollouts += len(scores)

    def drain(self) -> dict[str, float]:
        share = (
            _light(self._scores),
            [_light(group) for group in self._groups],
            self.completion_tokens,
            self.score_seconds,
        )
        self._scores, self._groups, self.completion_tokens, self.score_seconds = [], [], 0, 0.0
        shares = gather_from_processes(share)
        scores = [score for part in shares for score in part[0]]
        groups = [group for part in shares for group in part[1]]
        tokens = sum(part[2] for part in shares)
        # the processes score side by side: the step waited for the slowest
        seconds = max(part[3] for part in shares)
        metrics = summarise_scores(scores, self.worker_names, completion_tokens=tokens)
        if metrics:
            metrics["rollouts/score_seconds"] = seconds
            gap = multi_step_gap(groups)
            if gap is not None:
                metrics["reward/multi_minus_single"] = gap
            if self.unsolved is not None:
                drawn = sum(1 for s in scores if s.task_id in self.unsolved)
                metrics["curriculum/unsolved_share"] = drawn / len(scores)
        return metrics


def _light(scores: Sequence[RolloutScore]) -> list[RolloutScore]:
    """``scores`` without their execution records (worker replies), which no metric
    reads and which would make every gather carry every reply of the step."""
    if all(s.execution is None for s in scores):
        return list(scores)
    return [dataclasses.replace(s, execution=None) for s in scores]


def multi_step_gap(groups: Sequence[Sequence[RolloutScore]]) -> float | None:
    """What a multi-step attempt earns over a single-step one of the same prompt: the mean,
    over the groups holding both, of (mean reward of the rollouts that attempted two or more
    steps - mean reward of those that attempted one). Attempts count parsed or not (an
    unparseable multi-step attempt is part of what trying costs); masked rollouts and
    completions with no readable ``model_id`` list do not count. ``None``: no such group.
    This is the signal GRPO gets for writing workflows: below 0, it learns to stop."""
    gaps = []
    for group in groups:
        multi = [s.reward for s in group if s.reward is not None and s.attempted_steps > 1]
        single = [s.reward for s in group if s.reward is not None and s.attempted_steps == 1]
        if multi and single:
            gaps.append(_mean(multi) - _mean(single))  # type: ignore[arg-type]
    return _mean(gaps) if gaps else None


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
        "rollouts/multi_step_attempt_share": sum(1 for s in scores if s.attempted_steps > 1) / n,
        "rollouts/unequal_lists_rate": sum(1 for s in scores if s.unequal_lists) / n,
        "workflow/steps_mean": _mean([s.n_steps for s in parsed]),
        "workflow/cost_usd_mean": _mean([s.cost_usd for s in parsed]),
        # what the rollouts paid the workers (cache hits are free): the training spend cap
        "workflow/cost_usd_sum": float(sum(s.cost_usd for s in scores)),
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
