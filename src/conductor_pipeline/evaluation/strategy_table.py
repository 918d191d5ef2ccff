"""The table ``conductor strategies`` prints: the exact expectations of
:mod:`~conductor_pipeline.evaluation.strategies`, checked by a Monte-Carlo run of the real
workers, with their cost.

**Monte-Carlo** (:func:`monte_carlo_table`): the same workflows run by the real executor
(``execute_workflow``, real worker prompts) against the real simulated workers
(``SimulatedWorker.respond``) at several server seeds, in-process instead of over HTTP, each
answer judged by ``tasks.verify`` as evaluation judges it. Cost and calls per question are
the means of these runs, priced with the profiles' per-token prices: they are measured, not
estimated; without a Monte-Carlo run (``seeds=0``) they are left empty. Each run is also
predicted from the luck its workers drew; a run judged otherwise counts in
``mc_mismatches`` (on the sandbox's splits: propositional-logic questions whose
reasoning-gym scorer accepts an answer the sandbox made up to be wrong). The exact and the
Monte-Carlo accuracy must agree.

Core packages only: no Kedro, no MLflow.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from conductor_pipeline.evaluation.strategies import (
    PROMPT,
    SimulatedPool,
    Strategy,
    build_strategies,
    curriculum_table,
    exact_table,
    group_means,
    specialists,
    step_outcomes,
    strongest_worker,
)
from conductor_pipeline.tasks import Task, verify
from conductor_pipeline.workers.sandbox.profiles import SandboxProfiles
from conductor_pipeline.workers.sandbox.simulated import SimulatedWorker, TaskIndex
from conductor_pipeline.workers.types import Usage, WorkerReply
from conductor_pipeline.workflow import ExecutionResult, Workflow, execute_workflow

__all__ = ["SimulatedCaller", "StrategyReport", "monte_carlo_table", "strategy_table"]


class SimulatedCaller:
    """A :class:`~conductor_pipeline.workers.types.WorkerCaller` that answers in-process
    with the sandbox's simulated workers at one server seed, as the sandbox server answers
    a pool's request (seed = sample index, temperature 1.0: what the server takes when the
    pool sends none), priced with the profiles' per-token prices."""

    def __init__(self, pool: SimulatedPool, index: TaskIndex, seed: int) -> None:
        self.workers = {
            w: SimulatedWorker(pool.profile(w), index, base_seed=seed) for w in pool.simulated
        }

    async def __call__(
        self,
        worker: int,
        messages: list[dict[str, str]],
        sample_index: int = 0,
        *,
        max_tokens: int | None = None,
    ) -> WorkerReply:
        sim = self.workers[worker]
        # a budget's cap, as the server honours a request's max_tokens
        reply = sim.respond(messages, seed=sample_index, temperature=1.0, max_tokens=max_tokens)
        profile = sim.profile
        cost = (
            reply.prompt_tokens * profile.input_cost_per_token
            + reply.completion_tokens * profile.output_cost_per_token
        )
        usage = Usage(reply.prompt_tokens, reply.completion_tokens, cost, reply.latency_s)
        return WorkerReply(worker=profile.name, text=reply.text, usage=usage)


def _correct(task: Task, answer: str | None) -> bool:
    """``tasks.verify``, as evaluation judges an answer (it tests a piece of code once per
    task, so repeated runs of a strategy cost no more sandbox runs)."""
    return verify(task, answer or "").correct


def _luck(caller: SimulatedCaller, task: Task) -> dict[int, tuple[bool, bool]]:
    """Each worker's fixed luck on ``task`` at the caller's server seed, as (solved, checked)."""
    luck = {}
    for w, sim in caller.workers.items():
        draw = sim.luck(task)
        skill = sim.profile.skill_for(task.domain, task.difficulty)
        luck[w] = (draw.solve < skill, draw.check < sim.profile.verify_skill)
    return luck


@dataclass(frozen=True)
class _Outcome:
    right: bool  # the verdict of tasks.verify on the executed workflow's answer
    predicted: bool  # what step_outcomes says, from the luck the workers drew
    cost_usd: float
    calls: int


def _outcome(
    strategy: Strategy,
    plan: Workflow,
    task: Task,
    run: ExecutionResult,
    luck: Mapping[int, tuple[bool, bool]],
) -> _Outcome:
    steps = step_outcomes(plan, luck)
    if not strategy.any_step:
        return _Outcome(_correct(task, run.answer), steps[-1], run.cost_usd, run.calls)
    attempts = [(_correct(task, s.response), s.cost_usd) for s in run.steps]
    right = [cost for ok, cost in attempts if ok]
    cost = min(right or [cost for _, cost in attempts])
    return _Outcome(bool(right), any(steps), cost, 1)


async def _one_seed(
    strategies: Sequence[Strategy],
    tasks: Sequence[Task],
    pool: SimulatedPool,
    index: TaskIndex,
    seed: int,
) -> list[list[_Outcome]]:
    """Every strategy on every task at one server seed: ``[strategy][task]``."""
    caller = SimulatedCaller(pool, index, seed)
    luck = [_luck(caller, task) for task in tasks]
    out = []
    for strategy in strategies:
        plans = [strategy.plan(task) for task in tasks]
        runs = await asyncio.gather(
            *(
                execute_workflow(
                    plan, task.question, caller, config=PROMPT, worker_names=pool.names
                )
                for plan, task in zip(plans, tasks, strict=True)
            )
        )
        out.append(
            [
                _outcome(strategy, plan, task, run, drawn)
                for plan, task, run, drawn in zip(plans, tasks, runs, luck, strict=True)
            ]
        )
    return out


def monte_carlo_table(
    strategies: Sequence[Strategy],
    tasks: Sequence[Task],
    pool: SimulatedPool,
    seeds: Sequence[int],
) -> pd.DataFrame:
    """One row per strategy from real runs at each server seed of ``seeds``:

    * ``mc_accuracy``: the share of right answers over every (seed, task) pair, also per
      difficulty and domain;
    * ``mc_mismatches``: pairs whose verdict differs from what :func:`step_outcomes`
      predicts from the luck the workers drew there. Zero means the calculator states the
      real code's rule, so any gap between ``mc_accuracy`` and the exact ``accuracy`` is
      sampling noise;
    * ``cost_usd_per_q`` and ``calls_per_q``: means over the same runs; ``mc_pairs``.
    """
    seeds = list(seeds)
    index = TaskIndex(tasks)
    per_seed = [asyncio.run(_one_seed(strategies, tasks, pool, index, seed)) for seed in seeds]
    rows = []
    for k, strategy in enumerate(strategies):
        runs = [run[k] for run in per_seed]  # [seed][task]
        right = [sum(r[i].right for r in runs) / len(seeds) for i in range(len(tasks))]
        pairs = [o for r in runs for o in r]
        rows.append(
            {
                "strategy": strategy.name,
                **group_means(right, tasks, "mc_accuracy"),
                "mc_mismatches": sum(o.right != o.predicted for o in pairs),
                "cost_usd_per_q": sum(o.cost_usd for o in pairs) / len(pairs),
                "calls_per_q": sum(o.calls for o in pairs) / len(pairs),
                "mc_pairs": len(pairs),
            }
        )
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class StrategyReport:
    """:func:`strategy_table`'s answer: the table, and what it was computed with."""

    table: pd.DataFrame
    specialists: dict[str, str]  # domain -> worker name
    checker: str
    left_out: list[str]  # real workers, not computed
    tasks: int
    seeds: int
    # (reference worker, unsolved share) of the curriculum columns, when asked for
    curriculum: tuple[str, float] | None = None


def strategy_table(
    profiles: SandboxProfiles,
    tasks: Sequence[Task],
    *,
    seeds: int = 20,
    unsolved_share: float | None = None,
    reference: str | None = None,
) -> StrategyReport:
    """The exact table joined with a Monte-Carlo run over server seeds ``0 .. seeds-1``
    (none when ``seeds`` is 0: the Monte-Carlo and cost columns are then NaN), and with
    ``unsolved_share`` the :func:`curriculum_table` columns for ``reference`` (default: the
    checker, the strongest worker)."""
    if not tasks:
        raise ValueError("no tasks to compute strategies on")
    if reference is not None and unsolved_share is None:
        raise ValueError(
            f"reference worker {reference!r} given without unsolved_share: the curriculum "
            "columns need both (--unsolved-share)"
        )
    pool = SimulatedPool.from_profiles(profiles)
    strategies = build_strategies(pool, tasks)
    checker = strongest_worker(pool, tasks)
    table = exact_table(strategies, tasks, pool)
    curriculum = None
    if unsolved_share is not None:
        if reference is None:
            index = checker
        elif reference in pool.names:
            index = pool.names.index(reference)
        else:
            raise ValueError(
                f"reference worker {reference!r} is not in the pool {list(pool.names)}"
            )
        mix = curriculum_table(strategies, tasks, pool, index, unsolved_share)
        table = table.merge(mix, on="strategy", how="left", validate="one_to_one")
        curriculum = (pool.names[index], unsolved_share)
    if seeds > 0:
        mc = monte_carlo_table(strategies, tasks, pool, range(seeds))
        table = table.merge(mc, on="strategy", how="left", validate="one_to_one")
    else:
        for column in ("mc_accuracy", "mc_mismatches", "cost_usd_per_q", "calls_per_q"):
            table[column] = math.nan
    return StrategyReport(
        table=table,
        specialists={d: pool.names[w] for d, w in specialists(pool, tasks).items()},
        checker=pool.names[checker],
        left_out=pool.left_out,
        tasks=len(tasks),
        seeds=max(0, seeds),
        curriculum=curriculum,
    )
