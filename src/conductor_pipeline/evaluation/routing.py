"""What the Conductor learned, read off its test answers: where it sends the answer step and
which workflow shapes it writes, per domain.

Accuracy says *whether* a Conductor beats the baselines; this table says *how*: which worker
writes the final answer for maths, whether it learned to add a checker, to fan out and
aggregate, or stayed with one call. Comparing ``conductor`` with ``warm-start`` (same run,
before GRPO) separates what reinforcement learning taught from what the warm start drew at
random.

:func:`planning_by_difficulty` splits the same reading by difficulty as well: whether a
system spends more steps on hard questions than on easy ones.

Input is the per-question table (:func:`conductor_pipeline.evaluation.results_frame`); each
Conductor row's ``detail`` holds the final round's executed workflow (``workflow``: steps with
``worker_name`` and ``access``).
"""

from __future__ import annotations

import json
import math
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


def _conductor_rows(
    results: pd.DataFrame, systems: Sequence[str], split: str | None
) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """The rows of ``systems`` (in ``split`` unless None) and their parsed ``detail``."""
    frame = results if split is None else results[results["split"] == split]
    frame = frame[frame["system"].isin(systems)]
    return frame, [_detail(d) for d in frame["detail"]]


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
    frame, details = _conductor_rows(results, systems, split)
    if frame.empty:
        return pd.DataFrame(columns=ROUTING_COLUMNS)
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


# --- how a system plans, by domain and difficulty -----------------------------------------

# the task suites' difficulty levels, easiest first; any other value follows, sorted
DIFFICULTIES = ("easy", "medium", "hard")
# the ``difficulty`` of a question whose record names none
UNKNOWN_DIFFICULTY = "(unknown)"
PLANNING_COLUMNS = [
    "system",
    "domain",
    "difficulty",
    "questions",
    "multi_step_share",
    "mean_steps",
    "top_shape",
    "top_shape_share",
    "answer_worker",
    "answer_worker_share",
    "accuracy",
]


def difficulty_order(values: Sequence[Any]) -> list[str]:
    """The difficulty levels among ``values``: :data:`DIFFICULTIES` in order, then any
    other level sorted, :data:`UNKNOWN_DIFFICULTY` last."""
    seen = {str(v) for v in values}
    known = [d for d in DIFFICULTIES if d in seen]
    rest = sorted(seen - set(DIFFICULTIES) - {UNKNOWN_DIFFICULTY})
    return known + rest + ([UNKNOWN_DIFFICULTY] if UNKNOWN_DIFFICULTY in seen else [])


def _most_common(values: pd.Series, order: Sequence[str]) -> tuple[str, int]:
    """The most frequent value and its count; on a tie the one first in ``order`` (then
    alphabetically). ``("", 0)`` for no values."""
    counts = Counter(str(v) for v in values)
    if not counts:
        return "", 0
    rank = {name: i for i, name in enumerate(order)}
    value = min(counts, key=lambda v: (-counts[v], rank.get(v, len(rank)), v))
    return value, counts[value]


def _plan_row(system: str, domain: str, difficulty: str, rows: pd.DataFrame) -> dict[str, Any]:
    n = len(rows)
    with_workflow = rows[rows["n_steps"] > 0]
    shape, shape_count = _most_common(rows["shape"], [*SHAPES, NO_WORKFLOW])
    worker, worker_count = _most_common(with_workflow["answer_worker"], [])
    if not worker:
        worker, worker_count = NO_WORKFLOW, n
    return {
        "system": system,
        "domain": domain,
        "difficulty": difficulty,
        "questions": n,
        "multi_step_share": float((rows["n_steps"] > 1).sum()) / n,
        "mean_steps": float(with_workflow["n_steps"].mean()) if len(with_workflow) else math.nan,
        "top_shape": shape,
        "top_shape_share": shape_count / n,
        "answer_worker": worker,
        "answer_worker_share": worker_count / n,
        "accuracy": float(rows["correct"].mean()),
    }


def planning_by_difficulty(
    results: pd.DataFrame,
    *,
    systems: Sequence[str] = ("conductor", "warm-start"),
    split: str | None = "test",
) -> pd.DataFrame:
    """How each of ``systems`` plans, per domain and difficulty (:data:`PLANNING_COLUMNS`),
    with rows over all domains per difficulty (``domain = "(all)"``) after each system's
    domains; systems in the order given, domains sorted, difficulties in
    :func:`difficulty_order`.

    - ``questions``: the questions answered (rows with an infrastructure failure are left
      out, as in the summary's ``n`` and accuracy);
    - ``multi_step_share``: share of those questions answered by two or more steps;
    - ``mean_steps``: mean number of steps of the workflows written (a question without a
      workflow is not counted as 0 steps; NaN when no question had one);
    - ``top_shape`` / ``top_shape_share``: the most common workflow shape, ``(no workflow)``
      included, and its share of the questions;
    - ``answer_worker`` / ``answer_worker_share``: the worker of the answer (last) step most
      often, among questions with a workflow, and its share of all the questions
      (``(no workflow)`` when there was none);
    - ``accuracy``: share answered correctly.

    Steps, shapes and answer workers are read from each record's final workflow
    (:func:`question_routing`), exactly as :func:`routing_table` reads them."""
    frame, details = _conductor_rows(results, systems, split)
    if "infra_failure" in frame:
        failed = frame["infra_failure"].fillna(False).astype(bool).to_numpy()
        frame = frame[~failed]
        details = [d for d, f in zip(details, failed, strict=True) if not f]
    if frame.empty:
        return pd.DataFrame(columns=PLANNING_COLUMNS)
    routed = pd.DataFrame([question_routing(d) for d in details], index=frame.index)
    difficulty = (
        frame["difficulty"].fillna(UNKNOWN_DIFFICULTY).astype(str)
        if "difficulty" in frame
        else pd.Series(UNKNOWN_DIFFICULTY, index=frame.index)
    )
    frame = pd.concat(
        [
            frame[["system", "domain"]].astype(str),
            difficulty.rename("difficulty"),
            frame["correct"].fillna(False).astype(bool),
            routed,
        ],
        axis=1,
    )
    levels = difficulty_order(frame["difficulty"].unique())
    rows: list[dict[str, Any]] = []
    for system in [s for s in systems if s in set(frame["system"])]:
        mine = frame[frame["system"] == system]
        for domain in [*sorted(mine["domain"].unique()), ALL_DOMAINS]:
            part = mine if domain == ALL_DOMAINS else mine[mine["domain"] == domain]
            for level in levels:
                cell = part[part["difficulty"] == level]
                if len(cell):
                    rows.append(_plan_row(system, domain, level, cell))
    return pd.DataFrame(rows, columns=PLANNING_COLUMNS)
