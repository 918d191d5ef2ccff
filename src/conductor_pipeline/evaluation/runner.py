"""Run every configured system on the same questions, resumably and concurrently.

Order of work (each pair is skipped when the store already holds it), by the phase each
listed kind declares (:mod:`~conductor_pipeline.evaluation.kinds`):

1. At once: the Conductor systems (``conductor``, ``conductor+recursion``, ``champion``,
   ``warm-start``, ``base-policy``; at most ``conductor.in_flight`` questions in flight,
   their samples batched), and the solo runs of every worker on the test questions and on
   the validation questions the router (and ``handcrafted``) pick workers from, followed by
   ``moa`` (whose first layer then comes from the response cache) and ``handcrafted``.
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
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from conductor_pipeline.evaluation.config import EvaluationConfig
from conductor_pipeline.evaluation.kinds import derive_oracle, derive_router
from conductor_pipeline.evaluation.metrics import system_order
from conductor_pipeline.evaluation.policies import SharedSamples, batch_stats, batching_policy
from conductor_pipeline.evaluation.records import QuestionResult
from conductor_pipeline.evaluation.registry import KINDS, RunContext, SystemKind
from conductor_pipeline.evaluation.store import ResultStore
from conductor_pipeline.evaluation.systems import PoolView, System
from conductor_pipeline.tasks import Task
from conductor_pipeline.workers.pool import READ_ONLY_MISS
from conductor_pipeline.workers.types import WorkerReply
from conductor_pipeline.workflow import OrchestrationConfig

# derive_router and derive_oracle live with their kinds; importable from here as before
__all__ = [
    "EvaluationRun",
    "PolicyUnderTest",
    "RetryingCaller",
    "derive_oracle",
    "derive_router",
    "evaluate",
    "select_tasks",
]

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
        # a loop by hand, not tenacity: it retries on a returned reply (not an exception) and
        # adds every try's attempts to the reply, which tenacity would need callbacks for
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


class _SharedModels:
    """One batching queue and one sample memory per model object, and one local generation
    batch at a time whichever the model (``turn``)."""

    def __init__(self, batch_size: int):
        self.batch_size, self.turn = batch_size, asyncio.Lock()
        self.wrapped: dict[int, SharedSamples] = {}

    def __call__(self, policy: Any) -> SharedSamples:
        if id(policy) not in self.wrapped:
            batching = batching_policy(policy, max_batch=self.batch_size, turn=self.turn)
            self.wrapped[id(policy)] = SharedSamples(batching)
        return self.wrapped[id(policy)]

    def info(self) -> dict[str, Any]:
        stats = [batch_stats(w.policy) for w in self.wrapped.values()]
        return {
            "conductor_batches": [n for s in stats for n in s.batch_sizes],  # rows at the start
            "conductor_joined_rows": sum(s.joined for s in stats),
            "shared_samples": sum(w.hits for w in self.wrapped.values()),
        }


async def _phase(ctx: RunContext, kinds: Sequence[SystemKind], phase: str) -> None:
    """The listed kinds of ``phase``, one after another in registry order."""
    for kind in kinds:
        if kind.phase == phase:
            await kind.run(ctx)


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
    :class:`RetryingCaller` (module docstring); each listed kind runs in its phase
    (:mod:`~conductor_pipeline.evaluation.registry`)."""
    store = store if store is not None else ResultStore(None)
    retrying = RetryingCaller(pool.caller, config.infra_retries, config.retry_delay_s)
    pool = replace(pool, caller=retrying)
    orchestration = orchestration or OrchestrationConfig()
    if config.conductor.max_parse_attempts is not None:
        orchestration = replace(
            orchestration, max_parse_attempts=config.conductor.max_parse_attempts
        )
    models = _SharedModels(config.conductor.batch_size)
    policies = {"conductor": conductor, "base_policy": base_policy, "warm_start": warm_start}
    ctx = RunContext(
        config=config,
        pool=pool,
        orchestration=orchestration,
        test_tasks=test_tasks,
        # the questions the router and handcrafted pick workers on; solo runs them for the
        # workers a listed kind reads (SystemKind.fitted_workers), none when no kind does
        validation_tasks=list(validation_tasks),
        pool_id=pool_id,
        policies={**policies, "champion": champion},
        shared=models,
        runner=None,
        worker_limit=asyncio.Semaphore(config.concurrency),
        info={"pool": list(pool.names), "n_test": len(test_tasks)},
    )
    kinds = [kind for name, kind in KINDS.items() if config.wants(name)]
    for kind in kinds:
        kind.check(ctx)  # settings that do not fit the pool fail before any work
    conductor_systems = [s for k in kinds if k.phase == "conductor" for s in k.systems(ctx)]
    total = len(conductor_systems) * len(test_tasks)
    total += sum(k.pairs(ctx) for k in kinds if k.phase != "conductor")
    already = len(store)
    bar = _Progress(total, 0, progress)
    ctx.runner = runner = _Runner(store, bar)

    async def conductor_phase() -> None:
        if conductor_systems:
            in_flight = config.conductor.in_flight
            ctx.results.update(
                await runner.run_interleaved(conductor_systems, test_tasks, "test", in_flight)
            )

    try:
        await asyncio.gather(conductor_phase(), _phase(ctx, kinds, "workers"))
        await _phase(ctx, kinds, "sized")  # sized from the Conductor's results
    finally:
        bar.close()
    await _phase(ctx, kinds, "derived")
    ctx.info.update(runner.counts(total, already), worker_call_retries=retrying.stats)
    ctx.info.update(models.info())
    results, validation_results = ctx.results, ctx.validation_results
    ordered = [r for name in system_order(list(results)) for r in results[name]]
    # the router's fitting data, kept for the record (summaries read the test split only)
    ordered += [
        r for name in system_order(list(validation_results)) for r in validation_results[name]
    ]
    return EvaluationRun(ordered, ctx.info)
