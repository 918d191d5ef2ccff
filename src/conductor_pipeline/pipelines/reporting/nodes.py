"""reporting nodes: run the report notebooks with papermill and return their HTML.

Each node writes the data it received from the catalog into a staging folder and hands the
notebook those paths (plus the MLflow tracking URI and run ids) as papermill parameters, so
the kernel reads exactly what this run produced, whichever catalog entry it came from,
and never opens a Kedro session itself. The HTML goes back to the catalog (which logs it to
MLflow); the executed notebook stays next to it, or as ``<name>.failed.ipynb`` when a cell
raised, in which case the node fails with that cell's error.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from conductor_pipeline.config_checks import check_keys
from conductor_pipeline.paths import mlflow_tracking_uri, project_root
from conductor_pipeline.reporting import execute_report

logger = logging.getLogger(__name__)

_KNOWN_KEYS = {"kernel_name", "timeout_s", "notebooks_dir", "output_dir", "rollout_samples"}


def reporting_settings(params: dict[str, Any]) -> dict[str, Any]:
    """The ``reporting`` parameters checked, with paths made absolute under the project."""
    check_keys("reporting", params or {}, _KNOWN_KEYS)
    root = project_root()

    def absolute(value: str | None, default: str) -> Path:
        path = Path(value or default)
        return path if path.is_absolute() else root / path

    return {
        "root": root,
        "kernel_name": (params or {}).get("kernel_name") or "python3",
        "timeout_s": float((params or {}).get("timeout_s") or 600),
        "notebooks_dir": absolute((params or {}).get("notebooks_dir"), "notebooks"),
        "output_dir": absolute((params or {}).get("output_dir"), "data/08_reporting"),
        "rollout_samples": (params or {}).get("rollout_samples"),
    }


def _tracking_uri() -> str:
    import os

    return os.environ.get("MLFLOW_TRACKING_URI") or mlflow_tracking_uri()


def _staging(settings: dict[str, Any], name: str) -> Path:
    folder = settings["output_dir"] / "report_inputs" / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def _write_json(folder: Path, name: str, data: Any) -> str | None:
    if not data:
        return None
    path = folder / name
    path.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    return str(path)


def _write_table(folder: Path, name: str, frame: pd.DataFrame | None) -> str | None:
    if frame is None or not isinstance(frame, pd.DataFrame):
        return None
    path = folder / name
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
    return str(path)


def _run(settings: dict[str, Any], name: str, parameters: dict[str, Any]) -> str:
    result = execute_report(
        settings["notebooks_dir"] / f"{name}.ipynb",
        settings["output_dir"],
        parameters,
        name=name,
        kernel_name=settings["kernel_name"],
        cwd=settings["notebooks_dir"],
        timeout_s=settings["timeout_s"],
        write_html=False,
    )
    logger.info("%s: papermill %.1f s", name, result.seconds)
    return result.html


def render_training_report(
    conductor_model_version: dict[str, Any],
    conductor_adapter_info: dict[str, Any],
    training_history: pd.DataFrame,
    params: dict[str, Any],
) -> str:
    """The training report (curves from the training run's MLflow metric history)."""
    settings = reporting_settings(params)
    staged = _staging(settings, "training_report")
    samples = settings["rollout_samples"]
    if samples and not Path(samples).is_absolute():
        samples = str(settings["root"] / samples)
    return _run(
        settings,
        "training_report",
        {
            "tracking_uri": _tracking_uri(),
            "run_id": (conductor_model_version or {}).get("run_id"),
            "model_version_path": _write_json(
                staged, "model_version.json", conductor_model_version
            ),
            "adapter_info_path": _write_json(staged, "adapter_info.json", conductor_adapter_info),
            "history_path": _write_table(staged, "history.parquet", training_history),
            "rollout_samples_path": samples,
        },
    )


def render_evaluation_report(
    evaluation_summary: pd.DataFrame,
    evaluation_summary_by_domain: pd.DataFrame,
    evaluation_results: pd.DataFrame,
    evaluation_run_info: dict[str, Any],
    promotion_decision: dict[str, Any],
    params: dict[str, Any],
) -> str:
    """The evaluation report, with the promotion decision on the evaluated version."""
    settings = reporting_settings(params)
    staged = _staging(settings, "evaluation_report")
    return _run(
        settings,
        "evaluation_report",
        {
            "tracking_uri": _tracking_uri(),
            "summary_path": _write_table(staged, "summary.csv", evaluation_summary),
            "by_domain_path": _write_table(staged, "by_domain.csv", evaluation_summary_by_domain),
            "results_path": _write_table(staged, "results.parquet", evaluation_results),
            "run_info_path": _write_json(staged, "run_info.json", evaluation_run_info),
            "promotion_decision_path": _write_json(
                staged, "promotion_decision.json", promotion_decision
            ),
        },
    )
