"""The training run's per-step metrics: read from the MLflow run (or the saved history
table), split per stage, and the first and last values of the headline metrics.

Metric names follow ``conductor_pipeline.training``: ``<stage>/<metric>`` with stage
``grpo`` or ``recursion`` (e.g. ``grpo/reward/mean``, ``grpo/rollouts/parse_rate``,
``grpo/workers/share/sim-sage``, ``grpo/domain/math/worker/sim-abacus``,
``grpo/shape/solve_check``, ``grpo/workflow/cost_usd_mean``), logged at the global
training step.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from conductor_pipeline.reporting.display import MissingInput

STAGES = ("grpo", "recursion")

_OTHER_PREFIXES = ("sft/", "training/")


def _is_training_metric(key: str) -> bool:
    return key.split("/", 1)[0] in STAGES or key.startswith(_OTHER_PREFIXES)


def metric_history_from_mlflow(tracking_uri: str, run_id: str) -> pd.DataFrame:
    """Long table ``key, step, value, timestamp`` of every training metric of ``run_id``."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as err:
        raise MissingInput(
            f"MLflow run {run_id} not found in {tracking_uri}: {str(err).splitlines()[0]}"
        ) from err
    rows = []
    for key in sorted(k for k in run.data.metrics if _is_training_metric(k)):
        for metric in client.get_metric_history(run_id, key):
            rows.append(
                {
                    "key": key,
                    "step": metric.step,
                    "value": metric.value,
                    "timestamp": metric.timestamp,
                }
            )
    return pd.DataFrame(rows, columns=["key", "step", "value", "timestamp"])


def _read_table(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".csv":
        return pd.read_csv(path)
    if path.suffix in (".json", ".jsonl"):
        return pd.read_json(path, lines=path.suffix == ".jsonl")
    raise ValueError(f"{path}: unsupported table format (parquet, csv, json, jsonl)")


def load_history(
    tracking_uri: str | None = None,
    run_id: str | None = None,
    history_path: str | Path | None = None,
) -> tuple[pd.DataFrame, str]:
    """The per-step training metrics as a wide table (one row per step, one column per
    metric) and where they came from. The MLflow run's history comes first (it is the
    record); the saved history table is the fallback."""
    reasons = []
    if tracking_uri and run_id:
        try:
            long = metric_history_from_mlflow(tracking_uri, run_id)
        except MissingInput as missing:
            reasons.append(str(missing))
        else:
            if len(long):
                wide = (
                    long.sort_values("timestamp")
                    .pivot_table(index="step", columns="key", values="value", aggfunc="last")
                    .reset_index()
                )
                wide.columns.name = None
                return wide, f"MLflow run {run_id}"
            reasons.append(f"MLflow run {run_id} has no training metrics")
    else:
        reasons.append("no training run id was given")
    if history_path and Path(history_path).is_file():
        table = _read_table(history_path)
        if "step" in table and len(table):
            return table.sort_values("step").reset_index(drop=True), str(history_path)
        reasons.append(f"{history_path} holds no per-step rows")
    elif history_path:
        reasons.append(f"{history_path} does not exist")
    raise MissingInput("no training metrics: " + "; ".join(reasons))


def stage_steps(history: pd.DataFrame) -> pd.Series:
    """The steps at which a GRPO or recursion metric was logged (the SFT warm start logs
    ``sft/loss`` at its own steps 1 … n, which share the step column)."""
    columns = [c for c in history.columns if str(c).split("/", 1)[0] in STAGES]
    if not columns:
        return pd.Series([], dtype=float)
    return history.loc[history[columns].notna().any(axis=1), "step"]


def describe_history(history: pd.DataFrame, source: str) -> str:
    """The note under the overview: how many steps of each stage, and where from."""
    parts = [f"{len(stage_steps(history))} logged training steps"]
    if "sft/loss" in history:
        parts.append(f"{int(history['sft/loss'].notna().sum())} SFT steps")
    return f"{' and '.join(parts)}, read from {source}."


def default_sft_history(root: str | Path | None = None) -> Path | None:
    """The per-step SFT table training writes (catalog ``sft_history``,
    ``data/08_reporting/sft_history.csv``) when it exists: the fallback for a run whose
    MLflow record has no ``sft/loss``."""
    if root is None:
        from conductor_pipeline.paths import project_root

        root = project_root()
    path = Path(root) / "data" / "08_reporting" / "sft_history.csv"
    return path if path.is_file() else None


def stage_series(history: pd.DataFrame, metric: str) -> dict[str, pd.DataFrame]:
    """``{stage: frame(step, value)}`` of ``<stage>/<metric>`` for each stage present."""
    out = {}
    for stage in STAGES:
        column = f"{stage}/{metric}"
        if column in history:
            part = history[["step", column]].dropna()
            if len(part):
                out[stage] = part.rename(columns={column: "value"})
    return out


def _require(history: pd.DataFrame, metric: str) -> dict[str, pd.DataFrame]:
    series = stage_series(history, metric)
    if not series:
        raise MissingInput(f"the training history has no '<stage>/{metric}' metric")
    return series


def worker_label(worker: str) -> str:
    return f"{worker} (simulated)" if worker.startswith("sim-") else worker


_SUMMARY_METRICS = {
    "reward/mean": "mean reward",
    "rollouts/parse_rate": "parse rate",
    "rollouts/accuracy": "rollout accuracy",
    "workflow/steps_mean": "steps per workflow",
    "workflow/cost_usd_mean": "worker cost per rollout (USD)",
    "rollouts/infra_failure_rate": "infrastructure failure rate",
}


def start_end_table(history: pd.DataFrame) -> pd.DataFrame:
    """First and last logged value of the headline metrics, per stage."""
    rows = []
    for metric, label in _SUMMARY_METRICS.items():
        for stage, part in stage_series(history, metric).items():
            rows.append(
                {
                    "metric": label,
                    "stage": stage,
                    "first step": int(part["step"].iloc[0]),
                    "first": part["value"].iloc[0],
                    "last step": int(part["step"].iloc[-1]),
                    "last": part["value"].iloc[-1],
                }
            )
    if not rows:
        raise MissingInput("the training history has none of the headline metrics")
    return pd.DataFrame(rows)
