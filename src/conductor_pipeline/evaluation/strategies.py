"""What the sandbox rewards, computed: the expected accuracy of fixed strategies.

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

:func:`exact_table`: per task, enumerate the joint luck of the distinct workers of the
workflow (each solves with p = skill, checks with p = verify_skill, independently; a worker
that appears twice has the same luck both times), walk the steps in order with
``visible_reply_mode`` and add up the probability that the last step is right. It assumes
every worker sees the question, as it does in the sandbox profile
(``conductor.prompt.question_to_workers: true``).

:func:`curriculum_table`: the same expectation split by whether a reference worker, asked
alone, gets the question right, and mixed as GRPO's curriculum draws its questions
(``training.curriculum``): what each strategy's training reward is at a given share of
questions the reference gets wrong.

:mod:`~conductor_pipeline.evaluation.strategy_table` checks these against the real workers
(a Monte-Carlo run) and joins them into the table ``conductor strategies`` prints.

Only simulated workers enter: the sandbox's real model (``smollm2-135m``) has no declared
profile, so no strategy here calls it. This module imports core packages only: no Kedro,
no MLflow.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from conductor_pipeline.tasks import Task
from conductor_pipeline.workers.sandbox.profiles import SandboxProfiles, SimulatedProfile
from conductor_pipeline.workers.sandbox.simulated import RIGHT_MODES, visible_reply_mode
from conductor_pipeline.workflow import PromptConfig, Step, Workflow

__all__ = [
    "DIFFICULTIES",
    "PROMPT",
    "SimulatedPool",
    "Strategy",
    "build_strategies",
    "curriculum_table",
    "exact_accuracy",
    "exact_given_reference",
    "exact_table",
    "group_means",
    "specialists",
    "step_outcomes",
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


def _joint_luck(
    workers: Sequence[int], task: Task, pool: SimulatedPool
) -> Iterator[tuple[float, dict[int, tuple[bool, bool]]]]:
    """Every joint (solved, checked) luck of ``workers`` on ``task`` with its probability
    (each solves with p = skill, checks with p = verify_skill, independently)."""
    odds = [
        (pool.profile(w).skill_for(task.domain, task.difficulty), pool.profile(w).verify_skill)
        for w in workers
    ]
    for draws in itertools.product(_LUCK, repeat=len(workers)):
        p = math.prod(
            (s if solved else 1 - s) * (v if checked else 1 - v)
            for (solved, checked), (s, v) in zip(draws, odds, strict=True)
        )
        if p > 0.0:
            yield p, dict(zip(workers, draws, strict=True))


def _answers_right(
    workflow: Workflow, luck: Mapping[int, tuple[bool, bool]], any_step: bool
) -> bool:
    right = step_outcomes(workflow, luck)
    return any(right) if any_step else right[-1]


def exact_accuracy(
    workflow: Workflow, task: Task, pool: SimulatedPool, *, any_step: bool = False
) -> float:
    """The probability that ``workflow`` answers ``task`` right (``any_step``: that any of
    its steps does), summed over the joint luck of its distinct workers."""
    workers = sorted({step.worker for step in workflow.steps})
    return sum(
        p
        for p, luck in _joint_luck(workers, task, pool)
        if _answers_right(workflow, luck, any_step)
    )


def exact_given_reference(
    workflow: Workflow, task: Task, pool: SimulatedPool, reference: int, *, any_step: bool = False
) -> tuple[float, float]:
    """The probabilities that ``workflow`` answers ``task`` right and ``reference``, asked
    alone, answers it right; and right while ``reference`` alone answers wrong (a worker
    alone is right when it solves). What a curriculum that draws questions by the reference
    worker's verdict (``training.curriculum``) weighs."""
    workers = sorted({step.worker for step in workflow.steps} | {reference})
    with_right = with_wrong = 0.0
    for p, luck in _joint_luck(workers, task, pool):
        if _answers_right(workflow, luck, any_step):
            if luck[reference][0]:
                with_right += p
            else:
                with_wrong += p
    return with_right, with_wrong


def group_means(values: Sequence[float], tasks: Sequence[Task], column: str) -> dict[str, float]:
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
                **group_means(values, tasks, "accuracy"),
            }
        )
    return pd.DataFrame(rows)


def curriculum_table(
    strategies: Sequence[Strategy],
    tasks: Sequence[Task],
    pool: SimulatedPool,
    reference: int,
    unsolved_share: float,
) -> pd.DataFrame:
    """One row per strategy: its expected accuracy on the questions ``reference`` alone gets
    wrong (``reference_wrong``) and right (``reference_right``), and ``curriculum``, the two
    mixed as a step draws them when ``unsolved_share`` of its questions are ones the
    reference got wrong (``training.curriculum``). At the share the tasks have by
    themselves, ``curriculum`` is the exact ``accuracy``."""
    if not 0 <= unsolved_share <= 1:
        raise ValueError(f"unsolved_share must be in [0, 1], not {unsolved_share}")
    wrong = sum(1 - pool.profile(reference).skill_for(t.domain, t.difficulty) for t in tasks)
    right = len(tasks) - wrong
    rows = []
    for strategy in strategies:
        split = [
            exact_given_reference(
                strategy.plan(task), task, pool, reference, any_step=strategy.any_step
            )
            for task in tasks
        ]
        given_right = sum(r for r, _ in split) / right if right else math.nan
        given_wrong = sum(w for _, w in split) / wrong if wrong else math.nan
        mixed = unsolved_share * given_wrong + (1 - unsolved_share) * given_right
        rows.append(
            {
                "strategy": strategy.name,
                "reference_wrong": given_wrong,
                "reference_right": given_right,
                "curriculum": mixed,
            }
        )
    return pd.DataFrame(rows)
