"""The built-in system kinds: the Conductor models and the paper's baselines (§5).

Each class is the whole of a kind: its ``evaluation.<section>`` settings and their checks,
where its rows sort, and how it runs (:mod:`~conductor_pipeline.evaluation.registry`). A new
baseline is one more registered class here plus its name in ``evaluation.systems``. The
order of the classes is the default ``systems`` order and the Conductor kinds' report order.
"""

from __future__ import annotations

import asyncio
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from conductor_pipeline.evaluation.records import QuestionResult
from conductor_pipeline.evaluation.registry import (
    RunContext,
    SystemKind,
    check_int,
    check_names,
    register,
)
from conductor_pipeline.evaluation.systems import (
    BestOfNSystem,
    ConductorSystem,
    MoASystem,
    RandomWorkflowSystem,
    SoloSystem,
    System,
    fingerprint,
)
from conductor_pipeline.tasks import Task


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.fmean(values) if values else None


def _scored(rows: Iterable[QuestionResult]) -> list[QuestionResult]:
    """The rows that count: infra-failed ones are neither right nor wrong."""
    return [r for r in rows if not r.infra_failure]


# ---------------------------------------------------------------------------------------
# The Conductor models: one kind per model under test, all prompted alike
# ---------------------------------------------------------------------------------------


class ConductorKind(SystemKind):
    """A Conductor model from ``ctx.policies[policy]``, skipped when the caller gave none
    (``required``: an error instead). ``recursion``: with ``conductor.recursion_rounds``
    rounds instead of none. ``info_key``: its label is recorded in the run info."""

    phase = "conductor"
    writes_workflows = True
    policy: ClassVar[str]
    required: ClassVar[bool] = False
    recursion: ClassVar[bool] = False
    info_key: ClassVar[str | None] = None

    def systems(self, ctx: RunContext) -> list[System]:
        model = ctx.policies.get(self.policy)
        if model is None:
            if self.required:
                raise ValueError(f"evaluate: the {self.name} system needs a PolicyUnderTest")
            return []
        rounds = ctx.config.conductor.recursion_rounds if self.recursion else 0
        config = replace(ctx.orchestration, max_rounds=rounds)
        if self.info_key:
            ctx.info[self.info_key] = model.label
        system = ConductorSystem(
            self.name,
            ctx.shared(model.policy),
            ctx.pool,
            config,
            variant=fingerprint(ctx.pool_id, model.variant, config),
            label=model.label,
        )
        return [system]


@register
class Conductor(ConductorKind):
    name, rank, policy, required, info_key = "conductor", (0, 0), "conductor", True, "conductor"


@register
class ConductorRecursion(ConductorKind):
    name, rank, policy, recursion = "conductor+recursion", (1, 0), "conductor", True
    needs, needs_reason = "conductor", "needs conductor as well"


@register
class Champion(ConductorKind):
    """The registry's champion, beside a different candidate, for promotion to compare."""

    name, rank, policy, info_key = "champion", (1, 1), "champion", "champion"


@register
class WarmStart(ConductorKind):
    """The same training run's SFT-only adapter: differs from the Conductor only by GRPO."""

    name, rank, policy, info_key = "warm-start", (2, 0), "warm_start", "warm_start"


@register
class BasePolicy(ConductorKind):
    name, rank, policy = "base-policy", (2, 1), "base_policy"


# ---------------------------------------------------------------------------------------
# Baselines that call the workers
# ---------------------------------------------------------------------------------------


@register
class Solo(SystemKind):
    """Every worker on the question as it is; also on the validation questions the router
    is fitted on (for the workers the router may pick, when the router is listed)."""

    name, rank, per_worker = "solo", (3, 0), True

    def systems(self, ctx: RunContext) -> list[System]:
        return [SoloSystem(ctx.pool, i, pool_id=ctx.pool_id) for i in range(len(ctx.pool.names))]

    def _fitted(self, ctx: RunContext, solos: Sequence[System]) -> list[System]:
        if not ctx.config.wants("router"):
            return []
        names = ctx.settings("router").workers or list(ctx.pool.names)
        return [s for s in solos if s.name[len("solo:") :] in names]

    def pairs(self, ctx: RunContext) -> int:
        solos = self.systems(ctx)
        fitted = self._fitted(ctx, solos)
        return len(solos) * len(ctx.test_tasks) + len(fitted) * len(ctx.validation_tasks)

    async def run(self, ctx: RunContext) -> None:
        solos = self.systems(ctx)
        fitted = self._fitted(ctx, solos)
        run = ctx.runner.run_pairs
        outs = await asyncio.gather(
            *(run(s, ctx.test_tasks, "test", ctx.worker_limit) for s in solos),
            *(run(s, ctx.validation_tasks, "validation", ctx.worker_limit) for s in fitted),
        )
        # stored in pool order (not finishing order): ties in the report order follow it
        ctx.results.update(
            (s.name, rows) for s, rows in zip(solos, outs[: len(solos)], strict=True)
        )
        ctx.validation_results.update(
            (s.name, rows) for s, rows in zip(fitted, outs[len(solos) :], strict=True)
        )


@dataclass(frozen=True)
class MoASettings:
    proposers: list[str] | None = None  # None: every worker
    layers: int = 1
    aggregator: str = "random"  # "random" (seeded per question, among the proposers) or a name


@register
class MoA(SystemKind):
    name, rank, section, Settings = "moa", (4, 0), "moa", MoASettings

    def parse(self, section: dict[str, Any]) -> MoASettings:
        aggregator = section.get("aggregator", "random")
        if not isinstance(aggregator, str) or not aggregator:
            raise ValueError("evaluation.moa.aggregator: must be 'random' or a worker name")
        return MoASettings(
            proposers=check_names(section.get("proposers"), "moa.proposers"),
            layers=check_int(section.get("layers", 1), "moa.layers", minimum=1),
            aggregator=aggregator,
        )

    def systems(self, ctx: RunContext) -> list[System]:
        settings, pool = ctx.settings(self.name), ctx.pool
        proposers = [pool.index(n) for n in (settings.proposers or pool.names)]
        moa = MoASystem(
            pool,
            proposers,
            layers=settings.layers,
            aggregator=settings.aggregator,
            seed=ctx.config.seed,
            pool_id=ctx.pool_id,
        )
        return [moa]


@dataclass(frozen=True)
class RandomWorkflowSettings:
    workers: list[str] | None = None  # None: every worker


@register
class RandomWorkflow(SystemKind):
    """Random workflows as long, on average, as the Conductor's."""

    name, rank, phase = "random-workflow", (5, 0), "sized"
    section, Settings = "random_workflow", RandomWorkflowSettings
    needs, needs_reason = (
        "conductor",
        "is sized from the conductor's results; list conductor as well",
    )

    def parse(self, section: dict[str, Any]) -> RandomWorkflowSettings:
        return RandomWorkflowSettings(
            check_names(section.get("workers"), "random_workflow.workers")
        )

    def systems(self, ctx: RunContext) -> list[System]:
        lengths = [r.n_steps for r in ctx.results.get("conductor", []) if r.n_steps]
        mean_steps = _mean(lengths) or 1.0
        ctx.info["random_workflow_mean_steps"] = mean_steps
        if not lengths:
            ctx.info["random_workflow_note"] = "the conductor wrote no workflow; length 1 used"
        names = ctx.settings(self.name).workers
        orchestration = ctx.orchestration
        system = RandomWorkflowSystem(
            ctx.pool,
            mean_steps,
            workers=[ctx.pool.index(n) for n in names] if names else None,
            prompt=orchestration.prompt,
            budget=orchestration.budget,
            max_steps=orchestration.limits.max_steps,
            seed=ctx.config.seed,
            pool_id=ctx.pool_id,
        )
        return [system]


@dataclass(frozen=True)
class BestOfNSettings:
    worker: str = "auto"  # auto: the most expensive worker (by its prices)
    n: int | str = "auto"  # auto: matched to the Conductor's mean cost per question
    max_n: int = 8


@register
class BestOfN(SystemKind):
    """``n`` samples of one worker and a majority vote, ``n`` matched to the Conductor's cost."""

    name, rank, phase, per_worker = "best-of-n", (6, 0), "sized", True
    section, Settings = "best_of_n", BestOfNSettings
    needs, needs_reason = (
        "conductor",
        "is sized from the conductor's results; list conductor as well",
    )

    def parse(self, section: dict[str, Any]) -> BestOfNSettings:
        n = section.get("n", "auto")
        if n != "auto":
            check_int(n, "best_of_n.n", minimum=1)
        return BestOfNSettings(
            worker=str(section.get("worker", "auto")),
            n=n,
            max_n=check_int(section.get("max_n", 8), "best_of_n.max_n", minimum=1),
        )

    def systems(self, ctx: RunContext) -> list[System]:
        return [best_of_n_system(ctx)]


def _strongest_worker(ctx: RunContext) -> int:
    pool = ctx.pool
    if any(p is not None for p in pool.prices):
        # the strongest worker is the most expensive one in the paper's pool and in the sandbox
        return max(
            range(len(pool.names)),
            key=lambda i: (pool.prices[i][0] + pool.prices[i][1]) if pool.prices[i] else -1.0,
        )

    def accuracy(i: int) -> float:  # no prices: the best on the validation questions
        rows = _scored(ctx.validation_results.get(f"solo:{pool.names[i]}", []))
        return _mean(r.correct for r in rows) or 0.0

    return max(range(len(pool.names)), key=accuracy)


def best_of_n_system(ctx: RunContext) -> BestOfNSystem:
    """Best-of-n of the configured worker (``auto``: the strongest), ``n`` configured or the
    Conductor's mean cost per question over one solo call of that worker (at most ``max_n``)."""
    settings, pool = ctx.settings("best-of-n"), ctx.pool
    worker = _strongest_worker(ctx) if settings.worker == "auto" else pool.index(settings.worker)
    name = pool.names[worker]
    if settings.n != "auto":
        n, note = int(settings.n), f"n={settings.n} (configured)"
    else:
        conductor_cost = _mean(r.cost_usd for r in _scored(ctx.results.get("conductor", [])))
        solo_cost = _mean(r.cost_usd for r in _scored(ctx.results.get(f"solo:{name}", [])))
        if conductor_cost and solo_cost:
            ratio = conductor_cost / solo_cost
            n = min(max(round(ratio), 1), settings.max_n)
            note = f"n={n}: conductor ${conductor_cost:.6f}/q vs one {name} call ${solo_cost:.6f}/q"
        else:
            n, note = 1, "n=1: no conductor or solo cost to match"
    ctx.info["best_of_n"] = {"worker": name, "n": n, "note": note}
    return BestOfNSystem(pool, worker, n, pool_id=ctx.pool_id, note=note)


# ---------------------------------------------------------------------------------------
# Derived from the solo results, without calls
# ---------------------------------------------------------------------------------------

_FROM_SOLO = "is derived from the solo results; list solo as well"


@dataclass(frozen=True)
class RouterSettings:
    workers: list[str] | None = None  # the candidates; None: every worker


@register
class Router(SystemKind):
    name, rank, phase, section, Settings = "router", (7, 0), "derived", "router", RouterSettings
    needs, needs_reason = "solo", _FROM_SOLO

    def parse(self, section: dict[str, Any]) -> RouterSettings:
        return RouterSettings(check_names(section.get("workers"), "router.workers"))

    async def run(self, ctx: RunContext) -> None:
        candidates = ctx.settings("router").workers or list(ctx.pool.names)
        ctx.results["router"] = derive_router(
            ctx.results, ctx.validation_results, candidates, ctx.test_tasks, ctx.pool_id, ctx.info
        )


@register
class Oracle(SystemKind):
    name, rank, phase, needs, needs_reason = "oracle", (8, 0), "derived", "solo", _FROM_SOLO

    async def run(self, ctx: RunContext) -> None:
        solos = [ctx.results[f"solo:{name}"] for name in ctx.pool.names]
        ctx.results["oracle"] = derive_oracle(solos, ctx.pool_id)


def derive_router(
    results: dict[str, list[QuestionResult]],
    validation_results: dict[str, list[QuestionResult]],
    candidates: Sequence[str],
    test_tasks: Sequence[Task],
    pool_id: str,
    info: dict[str, Any],
) -> list[QuestionResult]:
    """One worker per domain: the candidate with the best validation accuracy in that domain
    (ties: the cheaper; a domain absent from validation: the best overall). Each test answer
    is that worker's solo answer."""

    def rank(rows: list[QuestionResult]) -> tuple[float, float]:
        return (_mean(r.correct for r in rows) or 0.0, -(_mean(r.cost_usd for r in rows) or 0.0))

    # an infra-failed validation answer says nothing about the worker
    overall = {w: _scored(validation_results.get(f"solo:{w}", [])) for w in candidates}
    default = max(candidates, key=lambda w: rank(overall[w]))
    choice: dict[str, str] = {}
    for domain in sorted({t.domain for t in test_tasks}):
        rows = {w: [r for r in overall[w] if r.domain == domain] for w in candidates}
        if any(rows.values()):
            choice[domain] = max(candidates, key=lambda w: rank(rows[w]))
        else:
            choice[domain] = default
    info["router"] = choice
    variant = fingerprint("router", pool_id, choice)
    by_system = {name: {r.question_id: r for r in rows} for name, rows in results.items()}
    routed = []
    for task in test_tasks:
        worker = choice[task.domain]
        source = by_system[f"solo:{worker}"][task.id]
        row = replace(source, system="router", variant=variant, note=f"routed to {worker}")
        row.detail = {"routed_to": worker, **source.detail}
        routed.append(row)
    return routed


def derive_oracle(
    solo_results: Sequence[list[QuestionResult]], pool_id: str
) -> list[QuestionResult]:
    """Per question: right if any solo worker was right; charged like the cheapest right
    worker (the cheapest worker when none was right). Infra-failed when any solo row of the
    question is: the missing answer could have changed the cost charged, or the verdict."""
    by_question: dict[str, list[QuestionResult]] = defaultdict(list)
    order: list[str] = []
    for rows in solo_results:
        for r in rows:
            if r.question_id not in by_question:
                order.append(r.question_id)
            by_question[r.question_id].append(r)
    variant = fingerprint(
        "oracle", pool_id, sorted({r.system for rows in solo_results for r in rows})
    )
    out = []
    for qid in order:
        rows = by_question[qid]
        right = [r for r in rows if r.correct]
        chosen = min(right or rows, key=lambda r: r.cost_usd)
        row = replace(
            chosen,
            system="oracle",
            variant=variant,
            correct=bool(right),
            infra_failure=any(r.infra_failure for r in rows),
            note=f"charged as {chosen.system}",
        )
        row.detail = {"right": [r.system for r in right], "charged_as": chosen.system}
        out.append(row)
    return out
