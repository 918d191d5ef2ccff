"""A scripted planner that writes the SFT warm-start workflows.

The warm start teaches a small base model the *format* of a Conductor reply and a few
workflow *shapes*; it must not teach routing, or GRPO has nothing left to learn (and the
"learned" routing would be ours). So by default (``routing: random``) every worker of every
example is drawn at random, seeded by the task id:

- ``single``: one worker solves the question.
- ``solve_check``: one worker solves it, a second sees that attempt and gives the answer.
- ``parallel_aggregate``: two workers solve it independently, a third sees both attempts
  and gives the answer.

The shape is drawn with the weights in ``SFTSettings.shapes``. A one-line reasoning names
the kind of question (its domain) and the shape in words before the three lists: the worker
numbers are then written with the words that should decide them in view, and only once (a
135M model that wrote them in the reasoning too often let the two copies disagree).

``routing: domain_table`` keeps the older rule for comparison: the solver is
``domain_workers[task.domain]`` (else ``default_worker``) and checks and aggregations go to
``verifier_worker``. It hands the Conductor a routing table; name it only on purpose.

When workers do not see the question (``question_to_workers: false``) solving subtasks carry
the full question; when they do, a short instruction is enough.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from conductor_pipeline.tasks import Task
from conductor_pipeline.training.configs import SFTSettings
from conductor_pipeline.workflow import Step, Workflow, render_workflow

__all__ = ["PlannedWorkflow", "ReferencePlanner"]

# Short on purpose: a 135M model learns to copy these in a few SFT steps.
_SOLVE = "{question}\nEnd with the final answer."
_SOLVE_SEEN = "Solve the question."
_CHECK = "Check the answer above and give the final answer."
_AGGREGATE = "Compare the answers above and give the final answer."


@dataclass(frozen=True)
class PlannedWorkflow:
    task_id: str
    workflow: Workflow
    reasoning: str
    shape: str

    @property
    def text(self) -> str:
        """The completion the Conductor is fine-tuned to produce."""
        return f"{self.reasoning}\n{render_workflow(self.workflow)}"


class ReferencePlanner:
    """Builds the scripted workflow for a task over a pool given by its worker names."""

    def __init__(
        self,
        worker_names: Sequence[str],
        settings: SFTSettings,
        seed: int = 0,
        *,
        question_to_workers: bool = False,
    ) -> None:
        if not worker_names:
            raise ValueError("the reference planner needs a non-empty worker pool")
        self.worker_names = list(worker_names)
        self.settings = settings
        self.seed = seed
        self.question_to_workers = question_to_workers

    def worker_for(self, name: str) -> int:
        """The index of a worker name; a name the pool lacks falls back to worker 0."""
        try:
            return self.worker_names.index(name)
        except ValueError:
            return 0

    def _workers(self, task: Task, rng: random.Random, count: int) -> list[int]:
        """``count`` workers for one workflow: solvers first, then the checker/aggregator."""
        n = len(self.worker_names)
        if self.settings.routing == "domain_table":
            solver = self.worker_for(
                self.settings.domain_workers.get(task.domain, self.settings.default_worker)
            )
            second = self.worker_for(self.settings.verifier_worker)
            solvers = [solver, second if second != solver else (solver + 1) % n]
            return (solvers[: count - 1] + [second]) if count > 1 else [solver]
        # distinct solvers where the pool allows, so two attempts are two opinions
        solvers = rng.sample(range(n), min(count - 1, n)) if count > 1 else []
        while len(solvers) < count - 1:
            solvers.append(rng.randrange(n))
        return [*solvers, rng.randrange(n)] if count > 1 else [rng.randrange(n)]

    def plan(self, task: Task) -> PlannedWorkflow:
        rng = random.Random(f"{self.seed}:{task.id}")
        names = list(self.settings.shapes)
        shape = rng.choices(names, weights=[self.settings.shapes[k] for k in names])[0]
        solve = (
            _SOLVE_SEEN
            if self.question_to_workers
            else _SOLVE.format(question=task.question.strip())
        )
        kind = task.domain.replace("_", " ")
        if shape == "single":
            (a,) = self._workers(task, rng, 1)
            steps = [Step(a, solve)]
            plan = "One worker solves it."
        elif shape == "solve_check":
            a, b = self._workers(task, rng, 2)
            steps = [Step(a, solve), Step(b, _CHECK, (0,))]
            plan = "One worker solves it, a second checks the answer."
        else:
            a, b, c = self._workers(task, rng, 3)
            steps = [Step(a, solve), Step(b, solve), Step(c, _AGGREGATE, (0, 1))]
            plan = "Two workers solve it separately, a third compares their answers."
        return PlannedWorkflow(task.id, Workflow(steps), f"A {kind} question. {plan}", shape)
