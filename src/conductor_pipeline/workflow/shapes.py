"""Name the shape of a workflow, so that reports can say *how* the Conductor plans.

``Workflow.access_pattern`` says how steps see each other (single, chain, independent,
tree); it cannot tell a "solve, then check" pair from a longer chain, nor a "parallel
attempts, then an aggregator" fan-in from any other tree. Those are the plans the warm start
teaches and the paper reports the Conductor learning, so training metrics and the
evaluation's routing table count workflows by these named shapes instead.

Pure functions on :class:`Workflow`; no I/O.
"""

from __future__ import annotations

from typing import Literal

from conductor_pipeline.workflow.types import Workflow

WorkflowShape = Literal[
    "single", "solve_check", "parallel_aggregate", "chain", "independent", "other"
]

# every value :func:`workflow_shape` returns, in the order reports list them
SHAPES: tuple[WorkflowShape, ...] = (
    "single",
    "solve_check",
    "parallel_aggregate",
    "chain",
    "independent",
    "other",
)


def _is_parallel_aggregate(workflow: Workflow) -> bool:
    """k >= 2 steps that see nothing, then a last step that sees every one of them."""
    *attempts, last = workflow.steps
    return (
        len(attempts) >= 2
        and all(not step.access for step in attempts)
        and last.access == tuple(range(len(attempts)))
    )


def _is_chain(workflow: Workflow) -> bool:
    """Three or more steps, each seeing its immediate predecessor (and maybe older ones)."""
    return len(workflow) >= 3 and all(
        (i - 1) in step.access for i, step in enumerate(workflow.steps) if i > 0
    )


def workflow_shape(workflow: Workflow) -> WorkflowShape:
    """The named shape of ``workflow`` (one of :data:`SHAPES`).

    - ``single``: one step.
    - ``solve_check``: two steps, the second sees the first (it checks or revises it).
    - ``parallel_aggregate``: two or more steps that see nothing, then a last step that sees
      all of them (and nothing else exists).
    - ``chain``: three or more steps, each sees the one before it.
    - ``independent``: two or more steps whose last (answer) step sees no earlier step, so
      the earlier steps cannot influence the answer.
    - ``other``: anything else, including the empty workflow of a recursion round.
    """
    n = len(workflow)
    if n == 0:
        return "other"
    if n == 1:
        return "single"
    if n == 2 and workflow[1].access == (0,):
        return "solve_check"
    if not workflow[-1].access:
        return "independent"
    if _is_parallel_aggregate(workflow):
        return "parallel_aggregate"
    if _is_chain(workflow):
        return "chain"
    return "other"
