"""The end of ``kedro run``: a short summary of what this run did (pipelines run, version
registered, promotion decided, the champion), the evaluation headline, the reports and how
to open MLflow, instead of the bare "Pipeline execution completed". Registered in
settings.py."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kedro.framework.hooks import hook_impl

from conductor_pipeline.distributed import is_main_process
from conductor_pipeline.paths import project_root
from conductor_pipeline.project import load_project_config

__all__ = ["MLFLOW_UI_COMMAND", "RunActivity", "RunSummaryHooks", "SUMMARY_FILES", "run_summary"]

logger = logging.getLogger(__name__)

# inside the profile's data tree (``data``, ``data/gpu``: conf/<env>/globals.yml)
SUMMARY_FILES = {
    "evaluation_summary": "08_reporting/evaluation_summary.csv",
    "training_report": "08_reporting/training_report.html",
    "evaluation_report": "08_reporting/evaluation_report.html",
}
# the datasets whose values say what a run registered and what it decided
REGISTERED_DATASET = "conductor_model_version"
DECISION_DATASET = "promotion_decision"
UNKNOWN = "unknown"
# the project's store, offline, every process stopped by Ctrl-C (conductor_pipeline.mlflow_ui);
# a bare `mlflow ui` would open ./mlflow.db instead
MLFLOW_UI_COMMAND = "make mlflow"


def _headline(summary_csv: Path) -> str:
    import pandas as pd

    from conductor_pipeline.reporting.display import MissingInput
    from conductor_pipeline.reporting.evaluation import best_baseline, system_label

    summary = pd.read_csv(summary_csv)
    table = summary.set_index("system")
    if "conductor" not in table.index:
        return "Evaluation: no conductor row in " + str(summary_csv)
    ours = table.loc["conductor"]

    def describe(name: str, row: Any) -> str:
        return (
            f"{name} {row['accuracy']:.3f} (95% CI {row['ci_low']:.3f}-{row['ci_high']:.3f}, "
            f"${row['cost_usd_per_q']:.6f}/question)"
        )

    line = f"Evaluation (test split, n={int(ours['n'])}): {describe('conductor', ours)}"
    try:
        row = best_baseline(summary)  # the same choice as the evaluation report's headline
    except MissingInput:
        return line
    best = row["system"]
    diff = float(ours["accuracy"]) - float(row["accuracy"])
    verdict = "ahead of" if diff > 0 else "behind" if diff < 0 else "level with"
    p_value = row.get("p_value_vs_conductor")
    p_text = f", p={float(p_value):.2g}" if p_value == p_value and p_value is not None else ""
    return (
        f"{line}\n  {verdict} the best baseline by {abs(diff):.3f}{p_text}: "
        f"{describe(system_label(str(best)), row)}"
    )


@dataclass
class RunActivity:
    """What one ``kedro run`` did, as the summary may state it: the ``pipelines`` named and
    how many ``nodes`` ran, the datasets its pipeline writes (``outputs``), the version it
    registered (``registered``), the promotion decision it made (``decision``, the
    ``promotion_decision`` record) and the champion when it ended (``champion``; ``None``
    when there is none, ``UNKNOWN`` when the registry could not be read)."""

    pipelines: tuple[str, ...] = ("__default__",)
    nodes: int = 0
    outputs: frozenset[str] = frozenset()
    registered: str | None = None
    decision: dict[str, Any] | None = None
    champion: str | None = UNKNOWN


def _ran(activity: RunActivity) -> str:
    nodes = (
        f" ({activity.nodes} node{'s' if activity.nodes != 1 else ''})" if activity.nodes else ""
    )
    return f"Ran: {', '.join(activity.pipelines)}{nodes}"


def _registered(activity: RunActivity, model: str) -> str:
    if activity.registered is None:
        return "Registered: nothing (no training in this run)"
    return (
        f"Registered: {model} version {activity.registered} (models:/{model}/{activity.registered})"
    )


def _champion_name(champion: str | None, model: str) -> str:
    if champion is None:
        return "none"
    if champion == UNKNOWN:
        return "unknown (the model registry could not be read)"
    return f"{model} version {champion} (models:/{model}@champion)"


def _promotion(activity: RunActivity, model: str) -> str:
    """The decision this run made, or that it made none: a decision file from an earlier
    run says nothing about this one."""
    decision = activity.decision
    if decision is None:
        return "Promotion: none in this run; champion unchanged: " + _champion_name(
            activity.champion, model
        )
    reasons = "; ".join(decision.get("reasons") or [])
    champion = decision.get("champion")
    return (
        f"Promotion: this run's candidate, version {decision.get('version')}, was "
        f"{decision.get('decision')}"
        + (f" ({reasons})" if reasons else "")
        + "\n  Champion: "
        + _champion_name(str(champion) if champion else None, model)
    )


def run_summary(
    root: Path,
    activity: RunActivity,
    *,
    data_root: str = "data",
    registered_model: str = "conductor",
) -> str:
    """What a person needs at the end of ``kedro run``: what this run did (``activity``: the
    pipelines it ran, the version it registered, the promotion decision it made or that it
    made none, and the champion), the evaluation headline (the Conductor against the best
    baseline), the two reports and how to open MLflow, from the profile's data tree and
    registered model. Only outputs this run writes are presented as its own."""
    shown = {k: f"{data_root}/{v}" for k, v in SUMMARY_FILES.items()}
    files = {k: root / v for k, v in shown.items()}
    lines = ["", "Run summary", "  " + _ran(activity)]
    if "evaluation_summary" not in activity.outputs:
        lines.append("  Evaluation: not run in this run")
    elif files["evaluation_summary"].is_file():
        lines.append("  " + _headline(files["evaluation_summary"]))
    else:
        lines.append(f"  Evaluation: {shown['evaluation_summary']} not written")
    lines.append("  " + _registered(activity, registered_model))
    lines.append("  " + _promotion(activity, registered_model))
    for key in ("training_report", "evaluation_report"):
        if key in activity.outputs:
            state = "" if files[key].is_file() else " (not written)"
        else:
            state = " (from an earlier run)" if files[key].is_file() else " (not written)"
        lines.append(f"  {key.replace('_', ' ').capitalize()}: {shown[key]}{state}")
    lines.append(f"  MLflow UI: {MLFLOW_UI_COMMAND}  (then http://127.0.0.1:5000)")
    return "\n".join(lines)


def current_champion(model: str) -> str | None:
    """The version ``models:/<model>@champion`` points at (None: no champion), or
    ``UNKNOWN`` when the registry cannot be read."""
    try:
        from conductor_pipeline.promotion import CHAMPION, current_versions

        return current_versions(name=model)[CHAMPION]
    except Exception as exc:  # a summary must never fail a finished run
        logger.warning("run summary: the champion could not be read: %s", exc)
        return UNKNOWN


class RunSummaryHooks:
    """Ends a run that evaluated the Conductor (``__default__``, ``evaluation``,
    ``retraining``) with :func:`run_summary` instead of the bare "Pipeline execution
    completed", stating only what this run did: what it registered and what promotion
    decision it made are taken from its own nodes' outputs as they run, into ``activity``
    (the current run's :class:`RunActivity`)."""

    def __init__(self) -> None:
        self.activity = RunActivity()

    @hook_impl
    def before_pipeline_run(self, run_params, pipeline, catalog) -> None:
        names = run_params.get("pipeline_names") or run_params.get("pipeline_name")
        names = [names] if isinstance(names, str) else list(names or ["__default__"])
        self.activity = RunActivity(
            pipelines=tuple(names), outputs=frozenset(pipeline.all_outputs())
        )

    @hook_impl
    def after_node_run(self, node, catalog, inputs, outputs, is_async, run_id) -> None:
        activity = self.activity
        activity.nodes += 1
        for name, value in (outputs or {}).items():
            if name == DECISION_DATASET and isinstance(value, dict):
                activity.decision = value
            elif name == REGISTERED_DATASET and isinstance(value, dict) and value.get("version"):
                activity.registered = str(value["version"])

    @hook_impl
    def after_pipeline_run(self, run_params, pipeline, catalog) -> None:
        if not is_main_process() or "evaluation_summary" not in pipeline.all_outputs():
            return
        try:
            root = project_root()
            profile = load_project_config(run_params.get("env"), root)
            activity = self.activity
            if activity.decision is None:
                activity.champion = current_champion(profile.registered_model)
            text = run_summary(
                root,
                activity,
                data_root=profile.data_root,
                registered_model=profile.registered_model,
            )
        except Exception as exc:  # a summary must never fail a finished run
            logger.warning("run summary unavailable: %s", exc)
            return
        print(text, flush=True)
