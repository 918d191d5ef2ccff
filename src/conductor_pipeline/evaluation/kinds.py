"""The built-in system kinds: the Conductor models and the paper's baselines (§5).

Each class is the whole of a kind: its ``evaluation.<section>`` settings (its own fields)
and their checks, where its rows sort, and how it runs
(:mod:`~conductor_pipeline.evaluation.registry`). A new baseline that answers questions
itself is one registered :class:`~conductor_pipeline.evaluation.baseline.Baseline` class
plus its name in ``evaluation.systems``. The order of the classes is the default ``systems``
order and the Conductor kinds' report order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import field, replace
from typing import Any, ClassVar

from conductor_pipeline.config_checks import check_int
from conductor_pipeline.evaluation.derived import (
    derive_oracle,
    derive_router,
    mean_of,
    route_by_domain,
    scored,
)
from conductor_pipeline.evaluation.fixed_workflows import HandcraftedSystem, RandomWorkflowSystem
from conductor_pipeline.evaluation.registry import (
    KINDS,
    RunContext,
    SystemKind,
    check_names,
    check_worker,
    register,
)
from conductor_pipeline.evaluation.systems import (
    BestOfNSystem,
    ConductorSystem,
    MoASystem,
    SoloSystem,
    System,
    fingerprint,
)

# ---------------------------------------------------------------------------------------
# The Conductor models: one kind per model under test, all prompted alike
# ---------------------------------------------------------------------------------------


class ConductorKind(SystemKind):
    """A Conductor model from ``ctx.policies[policy]``, skipped when the caller gave none
    (``required``: an error instead). It runs the recursion rounds that are served
    (``conductor.max_rounds``), so promotion gates what serving and ``conductor ask`` run;
    ``recursion``: with ``evaluation.conductor.recursion_rounds`` rounds instead.
    ``info_key``: its label is recorded in the run info."""

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
        served = ctx.orchestration.max_rounds
        rounds = ctx.config.conductor.recursion_rounds if self.recursion else served
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
    """Every worker on the question as it is; also on the validation questions, for the
    workers whose validation answers a listed kind reads (``fitted_workers``: the router's
    candidates, for instance)."""

    name, rank, per_worker = "solo", (3, 0), True

    def systems(self, ctx: RunContext) -> list[System]:
        return [SoloSystem(ctx.pool, i, pool_id=ctx.pool_id) for i in range(len(ctx.pool.names))]

    def _fitted(self, ctx: RunContext, solos: Sequence[System]) -> list[System]:
        names = {n for kind in ctx.config.systems for n in KINDS[kind].fitted_workers(ctx)}
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


@register
class MoA(SystemKind):
    name, rank = "moa", (4, 0)
    proposers: list[str] | None = None  # None: every worker
    layers: int = 1
    aggregator: str = "random"  # "random" (seeded per question, among the proposers) or a name

    def parse(self, section: dict[str, Any]) -> MoA:
        aggregator = section.get("aggregator", "random")
        if not isinstance(aggregator, str) or not aggregator:
            raise ValueError("evaluation.moa.aggregator: must be 'random' or a worker name")
        return MoA(
            proposers=check_names(section.get("proposers"), "moa.proposers"),
            layers=check_int(section.get("layers", 1), "evaluation.moa.layers", minimum=1),
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


@register
class RandomWorkflow(SystemKind):
    """Random workflows as long, on average, as the Conductor's."""

    name, rank, phase = "random-workflow", (5, 0), "sized"
    needs, needs_reason = (
        "conductor",
        "is sized from the conductor's results; list conductor as well",
    )
    workers: list[str] | None = None  # None: every worker

    def parse(self, section: dict[str, Any]) -> RandomWorkflow:
        return RandomWorkflow(
            workers=check_names(section.get("workers"), "random_workflow.workers")
        )

    def systems(self, ctx: RunContext) -> list[System]:
        lengths = [r.n_steps for r in ctx.results.get("conductor", []) if r.n_steps]
        mean_steps = mean_of(lengths) or 1.0
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


@register
class BestOfN(SystemKind):
    """``n`` samples of one worker and a majority vote, ``n`` matched to the Conductor's cost."""

    name, rank, phase, per_worker = "best-of-n", (6, 0), "sized", True
    needs, needs_reason = (
        "conductor",
        "is sized from the conductor's results; list conductor as well",
    )
    worker: str = "auto"  # auto: the most expensive worker (by its prices)
    n: int | str = "auto"  # auto: matched to the Conductor's mean cost per question
    max_n: int = 8

    def parse(self, section: dict[str, Any]) -> BestOfN:
        n = section.get("n", "auto")
        if n != "auto":
            check_int(n, "evaluation.best_of_n.n", minimum=1)
        return BestOfN(
            worker=str(section.get("worker", "auto")),
            n=n,
            max_n=check_int(section.get("max_n", 8), "evaluation.best_of_n.max_n", minimum=1),
        )

    def systems(self, ctx: RunContext) -> list[System]:
        return [best_of_n_system(ctx)]

    def fitted_workers(self, ctx: RunContext) -> list[str]:
        return _strongest_reads(ctx) if ctx.settings(self.name).worker == "auto" else []


def _strongest_reads(ctx: RunContext) -> list[str]:
    """The workers whose validation answers :func:`_strongest_worker` reads: none when the
    pool has prices, else every worker."""
    return [] if any(p is not None for p in ctx.pool.prices) else list(ctx.pool.names)


def _strongest_worker(ctx: RunContext) -> int:
    pool = ctx.pool
    if any(p is not None for p in pool.prices):
        # the strongest worker is the most expensive one in the paper's pool and in the sandbox
        return max(
            range(len(pool.names)),
            key=lambda i: (pool.prices[i][0] + pool.prices[i][1]) if pool.prices[i] else -1.0,
        )

    def accuracy(i: int) -> float:  # no prices: the best on the validation questions
        rows = scored(ctx.validation_results.get(f"solo:{pool.names[i]}", []))
        return mean_of(r.correct for r in rows) or 0.0

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
        conductor_cost = mean_of(r.cost_usd for r in scored(ctx.results.get("conductor", [])))
        solo_cost = mean_of(r.cost_usd for r in scored(ctx.results.get(f"solo:{name}", [])))
        if conductor_cost and solo_cost:
            ratio = conductor_cost / solo_cost
            n = min(max(round(ratio), 1), settings.max_n)
            note = f"n={n}: conductor ${conductor_cost:.6f}/q vs one {name} call ${solo_cost:.6f}/q"
        else:
            n, note = 1, "n=1: no conductor or solo cost to match"
    ctx.info["best_of_n"] = {"worker": name, "n": n, "note": note}
    return BestOfNSystem(pool, worker, n, pool_id=ctx.pool_id, note=note)


# ---------------------------------------------------------------------------------------
# Chosen per domain from the solo validation results: the router (derived, without calls)
# and the hand-written pipeline (told the domain); the oracle (derived from the test rows)
# ---------------------------------------------------------------------------------------

_FROM_SOLO = "is derived from the solo results; list solo as well"


def _router_candidates(ctx: RunContext) -> list[str]:
    return ctx.settings("router").workers or list(ctx.pool.names)


@register
class Router(SystemKind):
    name, rank, phase = "router", (7, 0), "derived"
    needs, needs_reason = "solo", _FROM_SOLO
    workers: list[str] | None = None  # the candidates; None: every worker

    def parse(self, section: dict[str, Any]) -> Router:
        return Router(workers=check_names(section.get("workers"), "router.workers"))

    def fitted_workers(self, ctx: RunContext) -> list[str]:
        return _router_candidates(ctx)

    async def run(self, ctx: RunContext) -> None:
        ctx.results["router"] = derive_router(
            ctx.results,
            ctx.validation_results,
            _router_candidates(ctx),
            ctx.test_tasks,
            ctx.pool_id,
            ctx.info,
        )


@register
class Handcrafted(SystemKind):
    """The paper's foil, a rigid hand-written pipeline that is *told* each question's domain
    (the Conductor infers it from the text): the domain's solver answers, then the checker
    sees that attempt and gives the final answer; where the solver is the checker, it alone
    (:func:`handcrafted_choice` says who is which). Phase ``workers``, registered after
    ``solo``: it reads solo's validation answers."""

    name, rank = "handcrafted", (7, 1)
    needs, needs_reason = "solo", "picks its solvers from the solo results; list solo as well"
    label_note = "told the domain"
    # domain -> worker name or "auto" (the router's pick among its candidates other than the
    # checker); "default": every unlisted domain. Empty (``solvers: auto``): auto everywhere
    solvers: dict[str, str] = field(default_factory=dict)
    checker: str = "auto"  # auto: the strongest worker (as best-of-n picks it)

    def solver(self, domain: str) -> str:
        return self.solvers.get(domain, self.solvers.get("default", "auto"))

    def parse(self, section: dict[str, Any]) -> Handcrafted:
        solvers = section.get("solvers", "auto")
        if solvers == "auto":
            solvers = {}
        elif not (
            isinstance(solvers, Mapping)
            and solvers
            and all(isinstance(k, str) and isinstance(v, str) and v for k, v in solvers.items())
        ):
            raise ValueError(
                "evaluation.handcrafted.solvers: must be 'auto' or a mapping of domain to worker "
                f"name or 'auto' ('default': any other domain), got {solvers!r}"
            )
        checker = section.get("checker", "auto")
        if not isinstance(checker, str) or not checker:
            raise ValueError(
                f"evaluation.handcrafted.checker: must be 'auto' or a worker name, got {checker!r}"
            )
        return Handcrafted(solvers=dict(solvers), checker=checker)

    def _auto_domains(self, ctx: RunContext) -> list[str]:
        settings = ctx.settings(self.name)
        return sorted({t.domain for t in ctx.test_tasks if settings.solver(t.domain) == "auto"})

    def check(self, ctx: RunContext) -> None:
        settings = ctx.settings(self.name)
        for domain, name in settings.solvers.items():
            if name != "auto":
                check_worker(ctx.pool, name, f"handcrafted.solvers.{domain}")
        if settings.checker != "auto":
            check_worker(ctx.pool, settings.checker, "handcrafted.checker")

    def fitted_workers(self, ctx: RunContext) -> list[str]:
        solvers = _router_candidates(ctx) if self._auto_domains(ctx) else []
        checkers = _strongest_reads(ctx) if ctx.settings(self.name).checker == "auto" else []
        return solvers + checkers

    def systems(self, ctx: RunContext) -> list[System]:
        choice = handcrafted_choice(ctx, self._auto_domains(ctx))
        ctx.info["handcrafted"] = {domain: list(pair) for domain, pair in choice.items()}
        orchestration = ctx.orchestration
        system = HandcraftedSystem(
            ctx.pool,
            choice,
            prompt=orchestration.prompt,
            budget=orchestration.budget,
            pool_id=ctx.pool_id,
        )
        return [system]


def handcrafted_choice(ctx: RunContext, auto: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Per test domain, (solver, checker): the configured checker or the strongest worker;
    the configured solver, or in the ``auto`` domains the router's pick
    (:func:`route_by_domain`) among its candidates other than the checker, since a worker
    checking its own attempt gains nothing (the checker alone if it is the only one)."""
    settings, pool = ctx.settings("handcrafted"), ctx.pool
    checker = settings.checker
    if checker == "auto":
        checker = pool.names[_strongest_worker(ctx)]
    candidates = [w for w in _router_candidates(ctx) if w != checker] or [checker]
    routed = route_by_domain(ctx.validation_results, candidates, auto)
    domains = sorted({t.domain for t in ctx.test_tasks})
    return {d: (routed.get(d) or settings.solver(d), checker) for d in domains}


@register
class Oracle(SystemKind):
    name, rank, phase, needs, needs_reason = "oracle", (8, 0), "derived", "solo", _FROM_SOLO

    async def run(self, ctx: RunContext) -> None:
        solos = [ctx.results[f"solo:{name}"] for name in ctx.pool.names]
        ctx.results["oracle"] = derive_oracle(solos, ctx.pool_id)
