"""A scripted planner that writes the SFT warm-start workflows.

The warm start teaches a small base model the *format* of a Conductor reply and the
workflow *shapes*; it must not teach routing, or GRPO has nothing left to learn (and the
"learned" routing would be ours). So by default (``routing: random``) every worker of every
example is drawn at random, seeded by the task id:

- ``single``: one worker solves the question.
- ``solve_check``: one worker solves it, a second sees that attempt and gives the answer.
- ``parallel_aggregate``: two (up to ``max_parallel_attempts``) workers solve it
  independently, one more sees every attempt and gives the answer.

With ``distinct_checker`` (the default) the worker that checks a single attempt is never its
solver, as a second opinion comes from someone else: a worker checking its own answer gains
nothing, in the sandbox as in the paper's Table 7, and a warm start that wrote "A, then A"
taught GRPO to spend steps on it. ``distinct_aggregator`` (the default too) keeps the worker
that aggregates parallel attempts off them as well. Without it "A and B, then A" is written
too, a second opinion all the same since A sees B's attempt; measured on four seeds, GRPO
then let weaker workers aggregate their own attempts (docs/measurements.md). Which workers,
still, is drawn at random.

The shape is drawn with the weights in ``SFTSettings.shapes``. GRPO can only reinforce
what the warm start already writes, so the multi-step shapes get most of the examples by
default. Subtasks are drawn from ``subtask_wordings`` wordings per role. One each is the
default, because the three lists must stay of equal length and a 135M model keeps count
more easily when each entry has a fixed length: measured at temperature 1 after 100 SFT
steps, one wording per role left 4.7 % of the samples with lists of unequal length, two
14 %, four or five 23 % (docs/measurements.md, "What the warm start writes").

The reply is a one-line reasoning that names the kind of question (its domain), then the
three lists. The plan is written once, in the lists: a reasoning sentence that also spelled
out the shape ("one worker solves it, a second checks") let a 135M model write one shape in
words and another in the lists, or lists of unequal length. The domain line stays: the
worker numbers are written right after it, so GRPO can tie them to the kind of question.

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

# Short wordings per role, a 135M model copies them after a few SFT steps. The examples draw
# from the first ``subtask_wordings`` of each (one by default, see the module docstring).
SOLVE_WORDINGS = (
    "Solve the question.",
    "Work out the answer.",
    "Solve it step by step.",
    "Answer the question.",
    "Find the answer and state it clearly.",
)
CHECK_WORDINGS = (
    "Check the answer above and give the final answer.",
    "Verify the previous answer and correct it if needed.",
    "Review the attempt above, then answer.",
    "Check this solution and state the final answer.",
)
AGGREGATE_WORDINGS = (
    "Compare the answers above and give the final answer.",
    "Pick the best of the answers above.",
    "Weigh these attempts and give the final answer.",
    "Decide which answer above is right and state it.",
)
# the full question goes into the subtask when workers do not see it
_SOLVE_WITH_QUESTION = "{question}\nEnd with the final answer."


@dataclass(frozen=True)
class PlannedWorkflow:
    task_id: str
    workflow: Workflow
    reasoning: str
    shape: str
    ids_last: bool = False  # the worker ids written after the subtasks and access list

    @property
    def text(self) -> str:
        """The completion the Conductor is fine-tuned to produce."""
        return f"{self.reasoning}\n{render_workflow(self.workflow, self.ids_last)}"


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

    def _workers(
        self, task: Task, rng: random.Random, count: int, distinct_last: bool = False
    ) -> list[int]:
        """``count`` workers for one workflow: solvers first, then the checker/aggregator,
        which ``distinct_last`` keeps off the solvers where the pool has another worker."""
        n = len(self.worker_names)
        if self.settings.routing == "domain_table":
            solver = self.worker_for(
                self.settings.domain_workers.get(task.domain, self.settings.default_worker)
            )
            second = self.worker_for(self.settings.verifier_worker)
            solvers = [solver] + [second if second != solver else (solver + 1) % n] * (count - 2)
            return [*solvers, second] if count > 1 else [solver]
        if count == 1:
            return [rng.randrange(n)]
        # distinct solvers where the pool allows, so the attempts are separate opinions
        solvers = rng.sample(range(n), min(count - 1, n))
        while len(solvers) < count - 1:
            solvers.append(rng.randrange(n))
        if self.settings.attempts_in_pool_order:
            solvers.sort()
        if distinct_last:
            others = [w for w in range(n) if w not in solvers]
            if others:  # a pool no larger than the solvers has no other worker to check
                return [*solvers, rng.choice(others)]
        return [*solvers, rng.randrange(n)]

    def _wording(self, wordings: Sequence[str], rng: random.Random) -> str:
        return rng.choice(wordings[: self.settings.subtask_wordings])

    def _solve(self, task: Task, rng: random.Random) -> str:
        if not self.question_to_workers:
            return _SOLVE_WITH_QUESTION.format(question=task.question.strip())
        return self._wording(SOLVE_WORDINGS, rng)

    def plan(self, task: Task) -> PlannedWorkflow:
        rng = random.Random(f"{self.seed}:{task.id}")
        names = list(self.settings.shapes)
        shape = rng.choices(names, weights=[self.settings.shapes[k] for k in names])[0]
        if shape == "single":
            (a,) = self._workers(task, rng, 1)
            steps = [Step(a, self._solve(task, rng))]
        elif shape == "solve_check":
            a, b = self._workers(task, rng, 2, self.settings.distinct_checker)
            check = self._wording(CHECK_WORDINGS, rng)
            steps = [Step(a, self._solve(task, rng)), Step(b, check, (0,))]
        else:
            attempts = rng.randint(2, self.settings.max_parallel_attempts)
            *solvers, last = self._workers(
                task, rng, attempts + 1, self.settings.distinct_aggregator
            )
            steps = [Step(w, self._solve(task, rng)) for w in solvers]
            aggregate = self._wording(AGGREGATE_WORDINGS, rng)
            steps.append(Step(last, aggregate, tuple(range(attempts))))
        reasoning = f"A {task.domain.replace('_', ' ')} question."
        return PlannedWorkflow(
            task.id, Workflow(steps), reasoning, shape, self.settings.model_id_last
        )
