"""Baselines that run a workflow written without a Conductor, through the Conductor's executor.

Each question gets one workflow, built by a fixed rule; :class:`FixedWorkflowSystem` executes
it exactly as a Conductor's workflow is executed (:func:`~conductor_pipeline.workflow.
execute_workflow`, the orchestration's prompt settings and budget) and records it alike:

- ``random-workflow`` (:class:`RandomWorkflowSystem`): random workers, a length whose mean is
  the Conductor's mean workflow length, every subtask containing the question, and binary
  access (``"all"`` or nothing, as the paper's Conductor writes).
- ``handcrafted`` (:class:`HandcraftedSystem`): the paper's foil, a rigid hand-written
  pipeline that is *told* each question's domain (the Conductor has to infer it): the
  domain's solver answers, then a checker sees that attempt and gives the final answer
  (:func:`handcrafted_workflow`). Which worker solves which domain, and which checks, is
  chosen by its kind (:class:`~conductor_pipeline.evaluation.kinds.Handcrafted`).

Subtasks contain the question: a worker sees only its subtask and the steps it may see.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from conductor_pipeline.evaluation.records import QuestionResult
from conductor_pipeline.evaluation.systems import PoolView, System, fingerprint, finish_result
from conductor_pipeline.tasks import Task
from conductor_pipeline.workflow import Budget, PromptConfig, Step, Workflow, execute_workflow

_SOLVE = "Solve the problem below and end with the final answer in the format it asks for.\n\n{q}"
_SOLVE_SEEING = (
    "Earlier attempts are shown above: check them, then solve the problem below and end "
    "with the final answer in the format it asks for.\n\n{q}"
)
_CHECK = (
    "Another worker's attempt at the problem below is shown above. Check it step by step, "
    "correct it if it is wrong, and end with the final answer in the format the problem "
    "asks for.\n\n{q}"
)


class FixedWorkflowSystem(System):
    """Runs the workflow :meth:`workflow` builds for each question with the Conductor's
    executor. Subclasses set ``name`` and ``variant`` and implement :meth:`workflow`."""

    def __init__(self, pool: PoolView, *, prompt: PromptConfig | None, budget: Budget | None):
        self.pool, self.prompt, self.budget = pool, prompt or PromptConfig(), budget

    def workflow(self, task: Task) -> tuple[Workflow, dict[str, Any]]:
        """The question's workflow, and what to record about how it was chosen."""
        raise NotImplementedError

    async def answer(self, task: Task, split: str) -> QuestionResult:
        workflow, about = self.workflow(task)
        execution = await execute_workflow(
            workflow,
            task.question,
            self.pool.call,
            config=self.prompt,
            budget=self.budget,
            worker_names=self.pool.names,
        )
        result = self.blank(task, split)
        ran = [s for s in execution.steps if s.started_at is not None]
        result.cost_usd, result.tokens, result.calls = (
            execution.cost_usd,
            execution.tokens,
            execution.calls,
        )
        result.failed_calls = execution.infra_failures
        result.infra_failure = result.failed_calls > 0
        result.cache_hits = execution.cache_hits
        result.latency_s = execution.latency_s
        result.workers = [s.worker_name or self.pool.names[s.worker] for s in ran]
        result.n_steps = len(workflow)
        result.access_pattern = workflow.access_pattern()
        result.detail = {**about, "workflow": workflow.to_dict(), "execution": execution.to_dict()}
        return await finish_result(result, task, execution.answer)


# ---------------------------------------------------------------------------------------
# random-workflow
# ---------------------------------------------------------------------------------------


def random_workflow(
    question: str,
    n_workers: int | Sequence[int],
    mean_steps: float,
    rng: random.Random,
    max_steps: int = 5,
) -> Workflow:
    """A random workflow: the length is ``floor(mean)`` or ``ceil(mean)`` (so its mean is
    ``mean_steps``), workers are drawn uniformly (from ``n_workers`` or the given indices),
    every subtask contains the question, and access is binary: step 0 sees nothing, each
    later step sees all earlier steps or none, with equal chance."""
    workers = list(range(n_workers)) if isinstance(n_workers, int) else list(n_workers)
    mean_steps = min(max(mean_steps, 1.0), float(max_steps))
    base = math.floor(mean_steps)
    length = base + (1 if rng.random() < mean_steps - base else 0)
    length = min(max(length, 1), max_steps)
    steps = []
    for i in range(length):
        sees_all = i > 0 and rng.random() < 0.5
        template = _SOLVE_SEEING if sees_all else _SOLVE
        steps.append(
            Step(
                rng.choice(workers),
                template.format(q=question.strip()),
                tuple(range(i)) if sees_all else (),
            )
        )
    return Workflow(steps)


class RandomWorkflowSystem(FixedWorkflowSystem):
    name = "random-workflow"

    def __init__(
        self,
        pool: PoolView,
        mean_steps: float,
        *,
        workers: Sequence[int] | None = None,
        prompt: PromptConfig | None = None,
        budget: Budget | None = None,
        max_steps: int = 5,
        seed: int = 0,
        pool_id: str = "",
    ):
        super().__init__(pool, prompt=prompt, budget=budget)
        self.mean_steps, self.seed, self.max_steps = mean_steps, seed, max_steps
        self.workers = list(workers) if workers is not None else list(range(len(pool.names)))
        self.variant = fingerprint(
            "random-workflow",
            pool_id,
            round(mean_steps, 2),
            [pool.names[w] for w in self.workers],
            self.prompt.question_to_workers,
            budget,
            max_steps,
            seed,
        )

    def workflow(self, task: Task) -> tuple[Workflow, dict[str, Any]]:
        rng = random.Random(f"random-workflow:{self.seed}:{task.id}")
        return random_workflow(
            task.question, self.workers, self.mean_steps, rng, self.max_steps
        ), {}


# ---------------------------------------------------------------------------------------
# handcrafted
# ---------------------------------------------------------------------------------------


def handcrafted_workflow(question: str, solver: int, checker: int) -> Workflow:
    """The hand-written pipeline: ``solver`` solves the question, then ``checker`` sees that
    attempt (access to step 0) and gives the final answer. When the solver is the checker,
    the solver alone: checking its own attempt gains a worker nothing (in the sandbox its
    luck on a task is fixed, as self-reflection leaves real models where they were)."""
    solve = Step(solver, _SOLVE.format(q=question.strip()))
    if solver == checker:
        return Workflow([solve])
    return Workflow([solve, Step(checker, _CHECK.format(q=question.strip()), (0,))])


class HandcraftedSystem(FixedWorkflowSystem):
    """:func:`handcrafted_workflow` with the workers ``choice`` gives each question's domain
    (``{domain: (solver name, checker name)}``); a domain without a choice is an error."""

    name = "handcrafted"

    def __init__(
        self,
        pool: PoolView,
        choice: Mapping[str, Sequence[str]],
        *,
        prompt: PromptConfig | None = None,
        budget: Budget | None = None,
        pool_id: str = "",
    ):
        super().__init__(pool, prompt=prompt, budget=budget)
        self.choice = {domain: (pair[0], pair[1]) for domain, pair in choice.items()}
        for name in {n for pair in self.choice.values() for n in pair}:
            pool.index(name)  # an unknown name fails here, not on every question
        self.variant = fingerprint(
            "handcrafted",
            pool_id,
            sorted(self.choice.items()),
            self.prompt.question_to_workers,
            budget,
            _SOLVE,
            _CHECK,
        )

    def workflow(self, task: Task) -> tuple[Workflow, dict[str, Any]]:
        if task.domain not in self.choice:
            raise ValueError(f"handcrafted: no workflow for the domain {task.domain!r}")
        solver, checker = self.choice[task.domain]
        workflow = handcrafted_workflow(
            task.question, self.pool.index(solver), self.pool.index(checker)
        )
        return workflow, {"domain": task.domain, "solver": solver, "checker": checker}
