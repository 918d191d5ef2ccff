"""Run every configured system on the same questions, resumably and concurrently.

Order of work (each pair is skipped when the store already holds it):

1. At once: the Conductor systems (``conductor``, ``conductor+recursion``, ``champion``,
   ``warm-start``, ``base-policy``; at most ``conductor.in_flight`` questions in flight,
   their samples batched), and the solo runs of every worker on the test questions and on
   the validation questions the router is fitted on, followed by ``moa`` (whose first
   layer then comes from the response cache).
2. Once the Conductor is done: ``random-workflow`` (sized by its mean workflow length) and
   ``best-of-n`` (``n`` matched to its mean cost).
3. Derived without calls: ``router`` and ``oracle``.

A tqdm bar counts pairs; each finished pair is appended to the store before the next
starts counting, so a killed run loses only the pairs in flight.

**Infrastructure failures change no answer.** Below the evaluation, the litellm Router
already retries a failed attempt (``num_retries`` per worker: timeouts, rate limits,
server errors). A call that still comes back as a failure (those, or an empty or malformed
reply) is asked again ``infra_retries`` times here, with the same sample index, so a
recovered call answers what it would have answered first time. A pair with a call that
failed after every retry, or whose system raised, is *infra-failed* as a whole, whatever
its answer: it is stored with ``infra_failure`` set, left out of accuracy (counted in
``infra_failures`` instead) and run again by the next resume. For a Conductor this means
the whole question, workflow included (the steps that answered come back from the response
cache), as training masks such a rollout instead of scoring it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from conductor_pipeline.evaluation.config import EvaluationConfig
from conductor_pipeline.evaluation.metrics import system_order
from conductor_pipeline.evaluation.policies import BatchingPolicy, SharedSamples
from conductor_pipeline.evaluation.records import QuestionResult
from conductor_pipeline.evaluation.store import ResultStore
from conductor_pipeline.evaluation.systems import (
    BestOfNSystem,
    ConductorSystem,
    MoASystem,
    PoolView,
    RandomWorkflowSystem,
    SoloSystem,
    System,
    fingerprint,
)
from conductor_pipeline.tasks import Task
from conductor_pipeline.workers.pool import READ_ONLY_MISS
from conductor_pipeline.workers.types import WorkerReply
from conductor_pipeline.workflow import OrchestrationConfig

logger = logging.getLogger(__name__)


@dataclass
class PolicyUnderTest:
    """A Conductor model to evaluate. ``variant`` identifies the model (e.g. ``conductor/3``,
    ``conductor/base``) in result keys; ``label`` says in the outputs what it is.
    ``adapter_dir``: the local LoRA folder the model loads, when it is one (where the same
    run's warm-start adapter is looked for)."""

    policy: Any
    variant: str
    label: str
    adapter_dir: str | None = None


@dataclass
class EvaluationRun:
    results: list[QuestionResult]
    info: dict[str, Any] = field(default_factory=dict)


def select_tasks(
    tasks: Iterable[Task], per_domain: int | None, seed: int, *, by: str = "domain"
) -> list[Task]:
    """A seeded sample of ``per_domain`` tasks from each domain (or each ``source`` with
    ``by="source"``; all when ``None``), in a stable order (by group, then id), independent
    of the input order."""
    by_domain: dict[str, list[Task]] = defaultdict(list)
    for task in tasks:
        by_domain[getattr(task, by)].append(task)
    chosen: list[Task] = []
    for domain in sorted(by_domain):
        group = sorted(by_domain[domain], key=lambda t: t.id)
        if per_domain is not None and per_domain < len(group):
            group = sorted(
                random.Random(f"{seed}:{domain}").sample(group, per_domain), key=lambda t: t.id
            )
        chosen.extend(group)
    return chosen


class _Progress:
    def __init__(self, total: int, done: int, enabled: bool):
        self.bar = None
        if enabled:
            import sys

            from tqdm.auto import tqdm

            # in a log file (not a terminal) a line every 30 s is enough
            interval = 1.0 if sys.stderr.isatty() else 30.0
            self.bar = tqdm(
                total=total, initial=done, desc="evaluation", unit="pair", mininterval=interval
            )

    def tick(self, system: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(system, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class RetryingCaller:
    """A worker caller that asks again, up to ``retries`` times, while a call fails for an
    infrastructure reason; waits ``delay_s`` (doubling) between tries. A cache miss of a
    ``read_only`` cache is not retried (nothing would change). ``retried`` counts the
    repeated calls, ``recovered`` the calls that succeeded on a retry and ``exhausted``
    those still failing after the last."""

    def __init__(self, caller: Any, retries: int, delay_s: float = 0.0):
        self.caller, self.retries, self.delay_s = caller, retries, delay_s
        self.retried = self.recovered = self.exhausted = 0

    async def __call__(
        self, worker: Any, messages: list[dict[str, str]], sample_index: int = 0, **overrides: Any
    ) -> WorkerReply:
        reply = await self.caller(worker, messages, sample_index, **overrides)
        attempts = reply.attempts
        tries = 0
        while not reply.ok and reply.error != READ_ONLY_MISS and tries < self.retries:
            if self.delay_s > 0:
                await asyncio.sleep(self.delay_s * 2**tries)
            tries += 1
            self.retried += 1
            reply = await self.caller(worker, messages, sample_index, **overrides)
            attempts += reply.attempts
        if tries and reply.ok:
            self.recovered += 1
        elif not reply.ok:
            self.exhausted += 1
        reply.attempts = attempts
        return reply

    @property
    def stats(self) -> dict[str, int]:
        return {"retried": self.retried, "recovered": self.recovered, "exhausted": self.exhausted}


def _scored(rows: Iterable[QuestionResult]) -> list[QuestionResult]:
    """The rows that count: infra-failed ones are neither right nor wrong."""
    return [r for r in rows if not r.infra_failure]


class _Runner:
    def __init__(self, store: ResultStore, progress: _Progress):
        self.store, self.progress = store, progress
        self.fresh = 0
        self.rerun_infra_failed = 0  # stored infra-failed pairs run again
        self.infra_failed = 0  # pairs run now that ended infra-failed

    def counts(self, total: int, stored_before: int) -> dict[str, int]:
        """What the run did, for the run info."""
        return {
            "pairs_run": self.fresh,
            "pairs_reused": total - self.fresh,
            "infra_failed_pairs": self.infra_failed,
            "infra_failed_pairs_rerun": self.rerun_infra_failed,
            "store_size_before": stored_before,
        }

    async def run_pairs(
        self, system: System, tasks: Sequence[Task], split: str, limit: asyncio.Semaphore
    ) -> list[QuestionResult]:
        async def one(task: Task) -> QuestionResult:
            done = self.store.get(system.name, task.id, system.variant)
            if done is not None and done.question_hash == QuestionResult.hash_task(
                task.question, task.answer
            ):
                if not done.infra_failure:
                    self.progress.tick(system.name)
                    return done
                self.rerun_infra_failed += 1  # not an answer: run it again
            async with limit:
                result = await system.run(task, split)
            self.store.add(result)
            self.fresh += 1
            self.infra_failed += int(result.infra_failure)
            self.progress.tick(system.name)
            return result

        return list(await asyncio.gather(*(one(t) for t in tasks)))

    async def run_interleaved(
        self, systems: Sequence[System], tasks: Sequence[Task], split: str, in_flight: int
    ) -> dict[str, list[QuestionResult]]:
        """Question-major order, so systems sharing samples run them at the same time; each
        system has ``in_flight`` questions open (a batch can only hold what is waiting)."""
        out: dict[str, list[QuestionResult]] = {s.name: [] for s in systems}
        limits = {s.name: asyncio.Semaphore(in_flight) for s in systems}

        async def one(system: System, task: Task) -> None:
            limit = limits[system.name]
            out[system.name].append((await self.run_pairs(system, [task], split, limit))[0])

        await asyncio.gather(*(one(s, t) for t in tasks for s in systems))
        order = {t.id: i for i, t in enumerate(tasks)}
        return {k: sorted(v, key=lambda r: order[r.question_id]) for k, v in out.items()}


def _with(config: OrchestrationConfig, **changes: Any) -> OrchestrationConfig:
    return replace(config, **changes)


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.fmean(values) if values else None


async def evaluate(
    test_tasks: Sequence[Task],
    pool: PoolView,
    config: EvaluationConfig,
    *,
    orchestration: OrchestrationConfig | None = None,
    conductor: PolicyUnderTest | None = None,
    base_policy: PolicyUnderTest | None = None,
    warm_start: PolicyUnderTest | None = None,
    champion: PolicyUnderTest | None = None,
    validation_tasks: Sequence[Task] = (),
    store: ResultStore | None = None,
    pool_id: str = "",
    progress: bool = True,
) -> EvaluationRun:
    """Evaluate the configured systems on ``test_tasks`` (already selected) over ``pool``.

    ``orchestration`` is the Conductor's sampling and prompt configuration (from the
    ``conductor`` parameters); ``config.conductor`` overrides its parse attempts and sets the
    recursion rounds. ``pool_id`` fingerprints the pool (workers, sandbox seed...), so that
    results from another pool are never reused. ``warm_start`` (the same training run's
    SFT-only adapter) is evaluated as ``warm-start`` with exactly the conductor's settings, so
    the two differ only by what GRPO learned; without it that system is left out. ``champion``
    (the registry's champion, when it is not the Conductor under test) is evaluated as
    ``champion`` with the same settings, for promotion to compare against. Returns the
    results of the current variants of every system, in (system, question) order, and an
    ``info`` dict (what was sized how, run, retried). Worker calls go through a
    :class:`RetryingCaller` (module docstring)."""
    store = store if store is not None else ResultStore(None)
    retrying = RetryingCaller(pool.caller, config.infra_retries, config.retry_delay_s)
    pool = replace(pool, caller=retrying)
    orchestration = orchestration or OrchestrationConfig()
    if config.conductor.max_parse_attempts is not None:
        orchestration = _with(orchestration, max_parse_attempts=config.conductor.max_parse_attempts)
    base_config = _with(orchestration, max_rounds=0)
    recursion_config = _with(orchestration, max_rounds=config.conductor.recursion_rounds)
    info: dict[str, Any] = {"pool": list(pool.names), "n_test": len(test_tasks)}

    wrapped: dict[int, Any] = {}
    turn = asyncio.Lock()  # one local generation batch at a time, whichever the model

    def shared(policy: Any) -> Any:
        # one batching queue and one sample memory per model object
        if id(policy) not in wrapped:
            wrapped[id(policy)] = SharedSamples(
                BatchingPolicy(policy, max_batch=config.conductor.batch_size, turn=turn)
            )
        return wrapped[id(policy)]

    conductor_systems: list[System] = []
    if conductor is not None and config.wants("conductor"):
        variant = fingerprint(pool_id, conductor.variant, base_config)
        conductor_systems.append(
            ConductorSystem(
                "conductor",
                shared(conductor.policy),
                pool,
                base_config,
                variant=variant,
                label=conductor.label,
            )
        )
        info["conductor"] = conductor.label
        if config.wants("conductor+recursion"):
            conductor_systems.append(
                ConductorSystem(
                    "conductor+recursion",
                    shared(conductor.policy),
                    pool,
                    recursion_config,
                    variant=fingerprint(pool_id, conductor.variant, recursion_config),
                    label=conductor.label,
                )
            )
    elif config.wants("conductor"):
        raise ValueError("evaluate: the conductor system needs a PolicyUnderTest")
    if warm_start is not None and config.wants("warm-start"):
        conductor_systems.append(
            ConductorSystem(
                "warm-start",
                shared(warm_start.policy),
                pool,
                base_config,
                variant=fingerprint(pool_id, warm_start.variant, base_config),
                label=warm_start.label,
            )
        )
        info["warm_start"] = warm_start.label
    if champion is not None and config.wants("champion"):
        conductor_systems.append(
            ConductorSystem(
                "champion",
                shared(champion.policy),
                pool,
                base_config,
                variant=fingerprint(pool_id, champion.variant, base_config),
                label=champion.label,
            )
        )
        info["champion"] = champion.label
    if base_policy is not None and config.wants("base-policy"):
        conductor_systems.append(
            ConductorSystem(
                "base-policy",
                shared(base_policy.policy),
                pool,
                base_config,
                variant=fingerprint(pool_id, base_policy.variant, base_config),
                label=base_policy.label,
            )
        )

    solos = [SoloSystem(pool, i, pool_id=pool_id) for i in range(len(pool.names))]
    router_names = config.router_workers or list(pool.names)
    validation = list(validation_tasks) if config.wants("router") else []
    total = len(conductor_systems) * len(test_tasks)
    if config.wants("solo"):
        total += len(solos) * len(test_tasks)
        total += sum(1 for s in solos if s.name[5:] in router_names) * len(validation)
    for kind in ("moa", "random-workflow"):
        total += len(test_tasks) if config.wants(kind) else 0
    total += len(test_tasks) if config.wants("best-of-n") else 0
    already = len(store)
    bar = _Progress(total, 0, progress)
    runner = _Runner(store, bar)
    worker_limit = asyncio.Semaphore(config.concurrency)
    results: dict[str, list[QuestionResult]] = {}
    validation_results: dict[str, list[QuestionResult]] = {}

    async def conductor_phase() -> None:
        if conductor_systems:
            results.update(
                await runner.run_interleaved(
                    conductor_systems, test_tasks, "test", config.conductor.in_flight
                )
            )

    async def worker_phase() -> None:
        if config.wants("solo"):
            solo_runs = [runner.run_pairs(s, test_tasks, "test", worker_limit) for s in solos]
            val_runs = [
                runner.run_pairs(s, validation, "validation", worker_limit)
                for s in solos
                if s.name[5:] in router_names
            ]
            outs = await asyncio.gather(*solo_runs, *val_runs)
            for s, out in zip(solos, outs[: len(solos)], strict=True):
                results[s.name] = out
            for s, out in zip(
                [s for s in solos if s.name[5:] in router_names], outs[len(solos) :], strict=True
            ):
                validation_results[s.name] = out
        if config.wants("moa"):
            proposers = [pool.index(n) for n in (config.moa.proposers or pool.names)]
            moa = MoASystem(
                pool,
                proposers,
                layers=config.moa.layers,
                aggregator=config.moa.aggregator,
                seed=config.seed,
                pool_id=pool_id,
            )
            results["moa"] = await runner.run_pairs(moa, test_tasks, "test", worker_limit)

    try:
        await asyncio.gather(conductor_phase(), worker_phase())

        reference = results.get("conductor", [])
        if config.wants("random-workflow"):
            lengths = [r.n_steps for r in reference if r.n_steps]
            mean_steps = _mean(lengths) or 1.0
            info["random_workflow_mean_steps"] = mean_steps
            if not lengths:
                info["random_workflow_note"] = "the conductor wrote no workflow; length 1 used"
            workers = (
                [pool.index(n) for n in config.random_workflow_workers]
                if config.random_workflow_workers
                else None
            )
            rw = RandomWorkflowSystem(
                pool,
                mean_steps,
                workers=workers,
                prompt=orchestration.prompt,
                budget=orchestration.budget,
                max_steps=orchestration.limits.max_steps,
                seed=config.seed,
                pool_id=pool_id,
            )
            results["random-workflow"] = await runner.run_pairs(
                rw, test_tasks, "test", worker_limit
            )
        if config.wants("best-of-n"):
            bon = _best_of_n(pool, config, reference, results, validation_results, pool_id, info)
            results[bon.name] = await runner.run_pairs(bon, test_tasks, "test", worker_limit)
    finally:
        bar.close()

    if config.wants("router") and config.wants("solo"):
        results["router"] = derive_router(
            results, validation_results, router_names, test_tasks, pool_id, info
        )
    if config.wants("oracle") and config.wants("solo"):
        results["oracle"] = derive_oracle([results[s.name] for s in solos], pool_id)
    info.update(runner.counts(total, already), worker_call_retries=retrying.stats)
    info["conductor_batches"] = [size for w in wrapped.values() for size in w.policy.batches]
    info["shared_samples"] = sum(w.hits for w in wrapped.values())
    ordered = [r for name in system_order(list(results)) for r in results[name]]
    # the router's fitting data, kept for the record (summaries read the test split only)
    ordered += [
        r for name in system_order(list(validation_results)) for r in validation_results[name]
    ]
    return EvaluationRun(ordered, info)


def _best_of_n(
    pool: PoolView,
    config: EvaluationConfig,
    reference: list[QuestionResult],
    results: dict[str, list[QuestionResult]],
    validation_results: dict[str, list[QuestionResult]],
    pool_id: str,
    info: dict[str, Any],
) -> BestOfNSystem:
    settings = config.best_of_n
    if settings.worker != "auto":
        worker = pool.index(settings.worker)
    elif any(p is not None for p in pool.prices):
        # the strongest worker is the most expensive one in the paper's pool and in the sandbox
        worker = max(
            range(len(pool.names)),
            key=lambda i: (pool.prices[i][0] + pool.prices[i][1]) if pool.prices[i] else -1.0,
        )
    else:  # no prices: the best on the validation questions
        worker = max(
            range(len(pool.names)),
            key=lambda i: (
                _mean(
                    r.correct for r in _scored(validation_results.get(f"solo:{pool.names[i]}", []))
                )
                or 0.0
            ),
        )
    name = pool.names[worker]
    if settings.n != "auto":
        n, note = int(settings.n), f"n={settings.n} (configured)"
    else:
        conductor_cost = _mean(r.cost_usd for r in _scored(reference))
        solo_cost = _mean(r.cost_usd for r in _scored(results.get(f"solo:{name}", [])))
        if conductor_cost and solo_cost:
            ratio = conductor_cost / solo_cost
            n = min(max(round(ratio), 1), settings.max_n)
            note = f"n={n}: conductor ${conductor_cost:.6f}/q vs one {name} call ${solo_cost:.6f}/q"
        else:
            n, note = 1, "n=1: no conductor or solo cost to match"
    info["best_of_n"] = {"worker": name, "n": n, "note": note}
    return BestOfNSystem(pool, worker, n, pool_id=pool_id, note=note)


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
