"""The end of ``kedro run``: a short summary (evaluation headline, champion, reports, how to
open MLflow) instead of the bare "Pipeline execution completed". Registered in settings.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from kedro.framework.hooks import hook_impl

from conductor_pipeline.distributed import is_main_process
from conductor_pipeline.paths import project_root
from conductor_pipeline.project import load_project_config

__all__ = ["MLFLOW_UI_COMMAND", "RunSummaryHooks", "SUMMARY_FILES", "run_summary"]

logger = logging.getLogger(__name__)

# inside the profile's data tree (``data``, ``data/gpu``: conf/<env>/globals.yml)
SUMMARY_FILES = {
    "evaluation_summary": "08_reporting/evaluation_summary.csv",
    "promotion_decision": "08_reporting/promotion_decision.json",
    "training_report": "08_reporting/training_report.html",
    "evaluation_report": "08_reporting/evaluation_report.html",
}
MLFLOW_UI_COMMAND = (
    ".venv/bin/mlflow ui --backend-store-uri sqlite:///$PWD/mlruns/mlflow.db --port 5000"
)


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


def _champion(decision_json: Path, model: str) -> str:
    decision = json.loads(decision_json.read_text())
    champion = decision.get("champion")
    reasons = "; ".join(decision.get("reasons") or [])
    head = (
        f"Champion: {model} version {champion} (models:/{model}@champion)"
        if champion
        else "Champion: none"
    )
    return (
        f"{head}; this run's version {decision.get('version')} was {decision.get('decision')}"
        + (f" ({reasons})" if reasons else "")
    )


def run_summary(root: Path, *, data_root: str = "data", registered_model: str = "conductor") -> str:
    """What a person needs at the end of ``kedro run``: the evaluation headline (the
    Conductor against the best baseline), the champion, the two reports and how to open
    MLflow, from the profile's data tree and registered model. Files that a partial run did
    not write are named as missing."""
    shown = {k: f"{data_root}/{v}" for k, v in SUMMARY_FILES.items()}
    files = {k: root / v for k, v in shown.items()}
    lines = ["", "Run summary"]
    if files["evaluation_summary"].is_file():
        lines.append("  " + _headline(files["evaluation_summary"]))
    else:
        lines.append(f"  Evaluation: {shown['evaluation_summary']} not written")
    if files["promotion_decision"].is_file():
        lines.append("  " + _champion(files["promotion_decision"], registered_model))
    else:
        lines.append("  Champion: no promotion decision in this run")
    for key in ("training_report", "evaluation_report"):
        state = "" if files[key].is_file() else " (not written by this run)"
        lines.append(f"  {key.replace('_', ' ').capitalize()}: {shown[key]}{state}")
    lines.append(f"  MLflow UI: {MLFLOW_UI_COMMAND}  (then http://127.0.0.1:5000)")
    return "\n".join(lines)


class RunSummaryHooks:
    """Ends a run that evaluated the Conductor (``__default__``, ``evaluation``,
    ``retraining``) with :func:`run_summary` instead of the bare "Pipeline execution
    completed"."""

    @hook_impl
    def after_pipeline_run(self, run_params, pipeline, catalog) -> None:
        if not is_main_process() or "evaluation_summary" not in pipeline.all_outputs():
            return
        try:
            root = project_root()
            profile = load_project_config(run_params.get("env"), root)
            text = run_summary(
                root, data_root=profile.data_root, registered_model=profile.registered_model
            )
        except Exception as exc:  # a summary must never fail a finished run
            logger.warning("run summary unavailable: %s", exc)
            return
        print(text, flush=True)
