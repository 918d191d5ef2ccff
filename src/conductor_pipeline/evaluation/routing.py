"""What the Conductor learned, read off its test answers: where it sends the answer step and
which workflow shapes it writes, per domain.

Accuracy says *whether* a Conductor beats the baselines; this table says *how*: which worker
writes the final answer for maths, whether it learned to add a checker, to fan out and
aggregate, or stayed with one call. Comparing ``conductor`` with ``warm-start`` (same run,
before GRPO) separates what reinforcement learning taught from what the warm start drew at
random.

Input is the per-question table (:func:`conductor_pipeline.evaluation.results_frame`); each
Conductor row's ``detail`` holds the final round's executed workflow (``workflow``: steps with
``worker_name`` and ``access``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pandas as pd

from conductor_pipeline.evaluation.config import CONDUCTOR_SYSTEMS
from conductor_pipeline.workflow import SHAPES, Step, Workflow, workflow_shape

ROUTING_COLUMNS = ["system", "domain", "kind", "value", "share", "count", "n"]
# the value of a question whose Conductor wrote no workflow (parse failure, system error)
NO_WORKFLOW = "(no workflow)"
# the ``domain`` of the rows over every question of a system
ALL_DOMAINS = "(all)"
MULTI_STEP = "multi_step"


def _detail(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value or "{}")
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _final_workflow(detail: dict[str, Any]) -> tuple[Workflow, list[str]] | None:
    """The workflow that produced the answer and its steps' worker names, or ``None``."""
    steps = detail.get("workflow") or []
    if not steps:
        return None
    names = list(detail.get("worker_names") or [])
    try:
        workflow = Workflow(
            [
                Step(int(s["worker"]), str(s.get("subtask") or "-"), tuple(s.get("access") or ()))
                for s in steps
            ]
        )
    except (KeyError, TypeError, ValueError):
        return None
    workers = [
        str(s.get("worker_name") or (names[w] if w < len(names) else w))
        for s, w in zip(steps, workflow.workers, strict=True)
    ]
    return workflow, workers


def question_routing(detail: dict[str, Any] | str) -> dict[str, Any]:
    """One question: the worker of its answer (last) step, its workflow shape and its number
    of steps (0 and :data:`NO_WORKFLOW` when the Conductor wrote none)."""
    final = _final_workflow(_detail(detail))
    if final is None:
        return {"answer_worker": NO_WORKFLOW, "shape": NO_WORKFLOW, "n_steps": 0}
    workflow, workers = final
    return {
        "answer_worker": workers[-1],
        "shape": workflow_shape(workflow),
        "n_steps": len(workflow),
    }


def _shares(
    system: str, domain: str, rows: pd.DataFrame, workers: Sequence[str]
) -> list[dict[str, Any]]:
    n = len(rows)
    out = []

    def add(kind: str, value: str, count: int) -> None:
        out.append(
            {
                "system": system,
                "domain": domain,
                "kind": kind,
                "value": value,
                "share": count / n if n else float("nan"),
                "count": count,
                "n": n,
            }
        )

    answered = Counter(rows["answer_worker"])
    for worker in [*workers, NO_WORKFLOW]:
        add("worker", worker, answered.get(worker, 0))
    shapes = Counter(rows["shape"])
    for shape in [*SHAPES, NO_WORKFLOW]:
        add("shape", shape, shapes.get(shape, 0))
    add("workflow", MULTI_STEP, int((rows["n_steps"] > 1).sum()))
    return out


def _pool_workers(frame: pd.DataFrame, details: Sequence[dict[str, Any]]) -> list[str]:
    """Every worker name, in pool order where the records give it, so that a worker the
    Conductor never picked still shows with share 0."""
    names: list[str] = []
    for detail in details:
        for name in detail.get("worker_names") or []:
            if name not in names:
                names.append(str(name))
    for name in frame["answer_worker"]:
        if name != NO_WORKFLOW and name not in names:
            names.append(name)
    return names


def routing_table(
    results: pd.DataFrame,
    *,
    systems: Sequence[str] = CONDUCTOR_SYSTEMS,
    by: str = "domain",
    split: str | None = "test",
) -> pd.DataFrame:
    """Long table (:data:`ROUTING_COLUMNS`), per Conductor system and domain (and over all
    domains, ``domain = "(all)"``): ``kind = worker``, the share of questions whose answer
    step went to each worker; ``kind = shape``, the share of each workflow shape
    (:data:`~conductor_pipeline.workflow.SHAPES`); ``kind = workflow, value = multi_step``,
    the share of questions answered by a workflow of two or more steps. Every share is over
    all ``n`` questions, so a question without a workflow counts under ``(no workflow)``.
    ``by = "source"`` groups by benchmark instead (still in the ``domain`` column)."""
    frame = results if split is None else results[results["split"] == split]
    frame = frame[frame["system"].isin(systems)]
    if frame.empty:
        return pd.DataFrame(columns=ROUTING_COLUMNS)
    details = [_detail(d) for d in frame["detail"]]
    routed = pd.DataFrame([question_routing(d) for d in details], index=frame.index)
    frame = pd.concat([frame[["system", by]].rename(columns={by: "domain"}), routed], axis=1)
    workers = _pool_workers(frame, details)
    rows: list[dict[str, Any]] = []
    for system in [s for s in systems if s in set(frame["system"])]:
        mine = frame[frame["system"] == system]
        for domain in sorted(mine["domain"].unique()):
            rows += _shares(system, str(domain), mine[mine["domain"] == domain], workers)
        rows += _shares(system, ALL_DOMAINS, mine, workers)
    return pd.DataFrame(rows, columns=ROUTING_COLUMNS)
