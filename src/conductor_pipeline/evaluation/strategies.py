"""What the sandbox rewards, computed: the accuracy and cost of fixed strategies.

The simulated workers of ``conf/base/sandbox_workers.yml`` declare how often they solve a
task (``skill[domain][difficulty]``) and how often they spot a correct earlier attempt
(``verify_skill``). A worker's luck on a task is drawn once per (server seed, worker,
task), and :func:`~conductor_pipeline.workers.sandbox.simulated.visible_reply_mode` is the
rule that turns that luck and the attempts a worker sees into a right or wrong answer. So
the expected accuracy of any fixed workflow follows from the profiles alone, and this
module computes it, exactly, for the strategies a Conductor could learn: one worker, the
best worker per domain, solve-then-check, parallel attempts then an aggregator. It shows
what reward GRPO can find in this pool: a worker checking itself gains nothing, a different
worker's check pays.

Two numbers per strategy, which must agree:

* **exact** (:func:`exact_table`): per task, enumerate the joint luck of the distinct
  workers of the workflow (each solves with p = skill, checks with p = verify_skill,
  independently; a worker that appears twice has the same luck both times), walk the steps
  in order with ``visible_reply_mode`` and add up the probability that the last step is
  right. It assumes every worker sees the question, as it does in the sandbox profile
  (``conductor.prompt.question_to_workers: true``).
* **Monte-Carlo** (:func:`monte_carlo_table`): the same workflows run by the real executor
  (``execute_workflow``, real worker prompts) against the real simulated workers
  (``SimulatedWorker.respond``) at several server seeds, in-process instead of over HTTP,
  each answer judged by ``tasks.verify`` as evaluation judges it. Cost and calls per
  question are the means of these runs, priced with the profiles' per-token prices: they
  are measured, not estimated; without a Monte-Carlo run (``seeds=0``) they are left empty.
  Each run is also predicted from the luck its workers drew; a run judged otherwise counts in
  ``mc_mismatches`` (on the sandbox's splits: propositional-logic questions whose
  reasoning-gym scorer accepts an answer the sandbox made up to be wrong).

Only simulated workers enter: the sandbox's real model (``smollm2-135m``) has no declared
profile, so no strategy here calls it. This module imports core packages only: no Kedro,
no MLflow.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from conductor_pipeline.tasks import Task, verify
from conductor_pipeline.workers.sandbox.profiles import SandboxProfiles, SimulatedProfile
from conductor_pipeline.workers.sandbox.simulated import (
    RIGHT_MODES,
    SimulatedWorker,
    TaskIndex,
    visible_reply_mode,
)
from conductor_pipeline.workers.types import Usage, WorkerReply
from conductor_pipeline.workflow import (
    ExecutionResult,
    PromptConfig,
    Step,
    Workflow,
    execute_workflow,
)

__all__ = [
    "DIFFICULTIES",
    "SimulatedCaller",
    "SimulatedPool",
    "Strategy",
    "StrategyReport",
    "build_strategies",
    "exact_accuracy",
    "exact_table",
    "monte_carlo_table",
    "specialists",
    "step_outcomes",
    "strategy_table",
    "strongest_worker",
]

DIFFICULTIES = ("easy", "medium", "hard")

# The subtasks. Workers see the question (``question_to_workers``), so short instructions do.
SOLVE = "Solve the question. End with the final answer."
CHECK = "Check the answer above and give the final answer."
COMPARE = "Compare the answers above and give the final answer."
PROMPT = PromptConfig(question_to_workers=True)


# --- the pool -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SimulatedPool:
    """The sandbox pool as workflows number it (``names``, the order of the profile file,
    simulated workers first) with each worker's profile; ``None`` for a real model."""

    names: tuple[str, ...]
    profiles: tuple[SimulatedProfile | None, ...]

    @classmethod
    def from_profiles(cls, profiles: SandboxProfiles) -> SimulatedPool:
        return cls(
            names=tuple(profiles.names),
            profiles=(*profiles.simulated, *(None for _ in profiles.real)),
        )

    @property
    def simulated(self) -> list[int]:
        return [i for i, p in enumerate(self.profiles) if p is not None]

    @property
    def left_out(self) -> list[str]:
        """The real workers, which no strategy here uses."""
        return [n for n, p in zip(self.names, self.profiles, strict=True) if p is None]

    def profile(self, worker: int) -> SimulatedProfile:
        profile = self.profiles[worker]
        if profile is None:
            raise ValueError(f"{self.names[worker]} is a real model: it has no profile to compute")
        return profile


def _mean_skill(profile: SimulatedProfile, tasks: Sequence[Task]) -> float:
    return sum(profile.skill_for(t.domain, t.difficulty) for t in tasks) / max(1, len(tasks))


def strongest_worker(pool: SimulatedPool, tasks: Sequence[Task]) -> int:
    """The simulated worker with the highest mean skill on ``tasks``: the checker every
    "-> checker" strategy uses (ties: the better verifier)."""
    return max(
        pool.simulated,
        key=lambda w: (_mean_skill(pool.profile(w), tasks), pool.profile(w).verify_skill),
    )


def specialists(pool: SimulatedPool, tasks: Sequence[Task]) -> dict[str, int]:
    """Per domain of ``tasks``, the simulated worker with the highest mean skill on that
    domain's tasks (the router's choice when the profiles are known; ties: the cheaper)."""
    choice: dict[str, int] = {}
    for domain in sorted({t.domain for t in tasks}):
        mine = [t for t in tasks if t.domain == domain]
        choice[domain] = max(
            pool.simulated,
            key=lambda w: (
                _mean_skill(pool.profile(w), mine),
                -pool.profile(w).output_cost_per_token,
            ),
        )
    return choice


# --- strategies ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Strategy:
    """A name and the rule that writes its workflow for a task.

    ``any_step``: the oracle. Its workflow holds one independent attempt per worker; it is
    right when any attempt is, and charged like evaluation's oracle: the cheapest right
    attempt (the cheapest attempt when none is right), one call.
    """

    name: str
    plan: Callable[[Task], Workflow]
    any_step: bool = False


def _always(workflow: Workflow) -> Callable[[Task], Workflow]:
    return lambda task: Workflow(list(workflow.steps))


def _solve_check(solver: int, checker: int) -> Workflow:
    return Workflow([Step(solver, SOLVE), Step(checker, CHECK, (0,))])


def _fan_in(solvers: Sequence[int], aggregator: int) -> Workflow:
    steps = [Step(w, SOLVE) for w in solvers]
    return Workflow([*steps, Step(aggregator, COMPARE, tuple(range(len(steps))))])


def build_strategies(pool: SimulatedPool, tasks: Sequence[Task]) -> list[Strategy]:
    """The fixed strategies over the simulated workers, specialists and checker chosen from
    the profiles on ``tasks`` (so any profile file works)."""
    sims = pool.simulated

    def name(worker: int) -> str:
        return pool.names[worker]

    best = strongest_worker(pool, tasks)
    spec = specialists(pool, tasks)

    def by_domain(write: Callable[[int], Workflow]) -> Callable[[Task], Workflow]:
        return lambda task: write(spec[task.domain])

    out = [Strategy(f"solo:{name(w)}", _always(Workflow([Step(w, SOLVE)]))) for w in sims]
    out.append(Strategy("router", by_domain(lambda s: Workflow([Step(s, SOLVE)]))))
    out.append(Strategy(f"self-check:{name(best)}", _always(_solve_check(best, best))))
    out.append(Strategy("self-check:specialist", by_domain(lambda s: _solve_check(s, s))))
    for checker in sims:
        out.append(
            Strategy(
                f"specialist -> {name(checker)}",
                by_domain(lambda s, c=checker: _solve_check(s, c)),
            )
        )
    for solver in sims:
        if solver != best:
            out.append(
                Strategy(f"{name(solver)} -> {name(best)}", _always(_solve_check(solver, best)))
            )
    out.append(
        Strategy(
            f"specialist + {name(best)} -> {name(best)}",
            by_domain(lambda s: _fan_in([s, best], best)),
        )
    )
    # the specialists two at a time (with two specialists the pair is the whole set), then
    # all of them, each followed by the checker: no routing, since every question gets the
    # same workers, yet most of what routing plus a check is worth
    distinct = sorted(set(spec.values()))
    pairs = list(itertools.combinations(distinct, 2)) if len(distinct) > 2 else []
    for solvers in [*pairs, distinct]:
        out.append(
            Strategy(
                f"{' + '.join(name(w) for w in solvers)} -> {name(best)}",
                _always(_fan_in(solvers, best)),
            )
        )
    out.append(Strategy(f"all simulated -> {name(best)}", _always(_fan_in(sims, best))))
    out.append(Strategy("oracle", _always(Workflow([Step(w, SOLVE) for w in sims])), any_step=True))
    return out


# --- the exact expectation ----------------------------------------------------------------

# a worker's luck on one task: (solved, checked)
_LUCK = ((True, True), (True, False), (False, True), (False, False))


def step_outcomes(workflow: Workflow, luck: Mapping[int, tuple[bool, bool]]) -> list[bool]:
    """Whether each step answers right, given each worker's (solved, checked) luck on the
    task: the sandbox's own rule, applied to what each step's access list shows it."""
    right: list[bool] = []
    for step in workflow.steps:
        solved, checked = luck[step.worker]
        seen = [right[j] for j in step.access]
        mode = visible_reply_mode(
            solved=solved, checked=checked, right_seen=any(seen), wrong_seen=not all(seen)
        )
        right.append(mode in RIGHT_MODES)
    return right


def exact_accuracy(
    workflow: Workflow, task: Task, pool: SimulatedPool, *, any_step: bool = False
) -> float:
    """The probability that ``workflow`` answers ``task`` right (``any_step``: that any of
    its steps does), summed over the joint luck of its distinct workers."""
    workers = sorted({step.worker for step in workflow.steps})
    odds = [
        (pool.profile(w).skill_for(task.domain, task.difficulty), pool.profile(w).verify_skill)
        for w in workers
    ]
    total = 0.0
    for draws in itertools.product(_LUCK, repeat=len(workers)):
        p = math.prod(
            (s if solved else 1 - s) * (v if checked else 1 - v)
            for (solved, checked), (s, v) in zip(draws, odds, strict=True)
        )
        if p == 0.0:
            continue
        right = step_outcomes(workflow, dict(zip(workers, draws, strict=True)))
        if any(right) if any_step else right[-1]:
            total += p
    return total


def _means(values: Sequence[float], tasks: Sequence[Task], column: str) -> dict[str, float]:
    """Overall, per difficulty and per domain means of per-task ``values``."""
    frame = pd.DataFrame(
        {
            "v": values,
            "difficulty": [t.difficulty for t in tasks],
            "domain": [t.domain for t in tasks],
        }
    )
    row = {column: float(frame["v"].mean())}
    for level in DIFFICULTIES:
        part = frame.loc[frame["difficulty"] == level, "v"]
        row[f"{column}_{level}"] = float(part.mean()) if len(part) else math.nan
    for domain, part in frame.groupby("domain")["v"]:
        row[f"{column}_{domain}"] = float(part.mean())
    return row


def exact_table(
    strategies: Sequence[Strategy], tasks: Sequence[Task], pool: SimulatedPool
) -> pd.DataFrame:
    """One row per strategy: ``strategy``, ``steps`` and the expected ``accuracy``, overall,
    per difficulty (``accuracy_easy`` ...) and per domain (``accuracy_math`` ...)."""
    rows = []
    for strategy in strategies:
        plans = [strategy.plan(task) for task in tasks]
        values = [
            exact_accuracy(plan, task, pool, any_step=strategy.any_step)
            for plan, task in zip(plans, tasks, strict=True)
        ]
        steps = {len(plan) for plan in plans}
        rows.append(
            {
                "strategy": strategy.name,
                "steps": steps.pop() if len(steps) == 1 else math.nan,
                **_means(values, tasks, "accuracy"),
            }
        )
    return pd.DataFrame(rows)


# --- the Monte-Carlo check with the real workers ------------------------------------------


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
                **_means(right, tasks, "mc_accuracy"),
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


def strategy_table(
    profiles: SandboxProfiles, tasks: Sequence[Task], *, seeds: int = 20
) -> StrategyReport:
    """The exact table joined with a Monte-Carlo run over server seeds ``0 .. seeds-1``
    (none when ``seeds`` is 0: the Monte-Carlo and cost columns are then NaN)."""
    if not tasks:
        raise ValueError("no tasks to compute strategies on")
    pool = SimulatedPool.from_profiles(profiles)
    strategies = build_strategies(pool, tasks)
    table = exact_table(strategies, tasks, pool)
    if seeds > 0:
        mc = monte_carlo_table(strategies, tasks, pool, range(seeds))
        table = table.merge(mc, on="strategy", how="left", validate="one_to_one")
    else:
        for column in ("mc_accuracy", "mc_mismatches", "cost_usd_per_q", "calls_per_q"):
            table[column] = math.nan
    return StrategyReport(
        table=table,
        specialists={d: pool.names[w] for d, w in specialists(pool, tasks).items()},
        checker=pool.names[strongest_worker(pool, tasks)],
        left_out=pool.left_out,
        tasks=len(tasks),
        seeds=max(0, seeds),
    )
