"""A scripted reference planner: hand-written rules that produce SFT warm-start workflows.

This is **not** a learned policy and makes no claim to be a good one. It only shows a
small base model what a well-formed Conductor reply looks like, with routing that is
plausible for the sandbox pool, so that GRPO starts from completions that parse. The rule:

1. The worker is ``domain_workers[task.domain]`` (a worker *name* from the training
   config), else ``default_worker``; a name the pool does not have falls back to worker 0.
2. Step 0 asks that worker to solve the question and end with the final answer. When
   workers do not see the question (``question_to_workers: false``) the subtask carries
   the **full question**; when they do, a short instruction is enough.
3. For a deterministic ``verify_share`` of the tasks (a hash of the task id and the seed),
   a second step asks ``verifier_worker`` to check step 0's attempt, which it sees through
   its access list, and to state the final answer.
4. A one-sentence reasoning line precedes the three lists, rendered with ``render_workflow``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from conductor_pipeline.tasks import Task
from conductor_pipeline.training.configs import SFTSettings
from conductor_pipeline.workflow import Step, Workflow, render_workflow

__all__ = ["PlannedWorkflow", "ReferencePlanner"]

# Short on purpose: a 135M model learns to copy these in a few SFT steps.
_SOLVE = "{question}\nEnd with the final answer."
_SOLVE_SEEN = "Solve the question step by step and end with the final answer."
_CHECK = "Check the answer above and give the correct final answer."


@dataclass(frozen=True)
class PlannedWorkflow:
    task_id: str
    workflow: Workflow
    reasoning: str

    @property
    def text(self) -> str:
        """The completion the Conductor is fine-tuned to produce."""
        return f"{self.reasoning}\n{render_workflow(self.workflow)}"


def _unit(*parts: object) -> float:
    digest = hashlib.sha256("|".join(map(str, parts)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


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
        try:
            return self.worker_names.index(name)
        except ValueError:
            return 0

    def solver(self, task: Task) -> int:
        name = self.settings.domain_workers.get(task.domain, self.settings.default_worker)
        return self.worker_for(name)

    def wants_check(self, task: Task) -> bool:
        return _unit("verify", self.seed, task.id) < self.settings.verify_share

    def plan(self, task: Task) -> PlannedWorkflow:
        solver = self.solver(task)
        solve = (
            _SOLVE_SEEN
            if self.question_to_workers
            else _SOLVE.format(question=task.question.strip())
        )
        steps = [Step(solver, solve)]
        kind = task.domain.replace("_", " ")
        if self.wants_check(task):
            checker = self.worker_for(self.settings.verifier_worker)
            steps.append(Step(checker, _CHECK, (0,)))
            reasoning = (
                f"This is a {kind} question: Worker {solver} solves it, "
                f"then Worker {checker} checks the answer."
            )
        else:
            reasoning = f"This is a {kind} question, so Worker {solver} solves it."
        return PlannedWorkflow(task.id, Workflow(steps), reasoning)
