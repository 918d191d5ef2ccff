"""MLflow fixtures shared by the report tests (tests/reporting) and the promotion pipeline
tests (tests/pipelines): a throw-away SQLite store, a training run's metric history and a
registry with a few versions of ``conductor``. Each conftest imports the ones its tests use."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest


def register_adapter(adapter: Path, artifact_location: Path, *, experiment: str) -> str:
    """Log the folder ``adapter`` in a run of a new ``experiment`` (artifacts under
    ``artifact_location``) and register it as the first version of `conductor`, as training
    does; returns the version."""
    experiment_id = mlflow.create_experiment(experiment, artifact_location=str(artifact_location))
    with mlflow.start_run(experiment_id=experiment_id) as run:
        mlflow.log_artifacts(str(adapter), "adapter")
    client = mlflow.MlflowClient()
    client.create_registered_model("conductor")
    created = client.create_model_version(
        "conductor", f"{run.info.artifact_uri}/adapter", run_id=run.info.run_id
    )
    return str(created.version)


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    return uri


@pytest.fixture
def training_run(tracking_uri, tmp_path) -> str:
    """An MLflow run with a GRPO metric history as training logs it (8 steps)."""
    experiment = mlflow.create_experiment("training", artifact_location=str(tmp_path / "art"))
    with mlflow.start_run(experiment_id=experiment) as run:
        for step in range(1, 9):
            share = min(0.1 * step, 0.7)
            mlflow.log_metrics(
                {
                    "grpo/reward/mean": 0.2 + 0.08 * step,
                    "grpo/reward/std": 0.1,
                    "grpo/reward/correctness_mean": 0.15 + 0.08 * step,
                    "grpo/rollouts/parse_rate": min(0.3 + 0.1 * step, 1.0),
                    "grpo/rollouts/accuracy": 0.3 + 0.05 * step,
                    "grpo/workflow/cost_usd_mean": 0.001 + 0.0001 * step,
                    "grpo/workflow/steps_mean": 1 + 0.1 * step,
                    "grpo/workers/share/sim-sage": share,
                    "grpo/workers/share/sim-sprout": 1 - share,
                    "grpo/loss": 0.5 / step,
                    # not training metrics: left out of the report
                    "eval.conductor.accuracy": 0.5,
                },
                step=step,
            )
    return run.info.run_id


@pytest.fixture
def registry(tracking_uri, tmp_path) -> list[str]:
    """Three versions of `conductor` (fake adapters), each tagged with its run fingerprint."""
    experiment = mlflow.create_experiment("promotion", artifact_location=str(tmp_path / "reg"))
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    client = mlflow.MlflowClient()
    client.create_registered_model("conductor")
    versions = []
    for i in range(3):
        with mlflow.start_run(experiment_id=experiment) as run:
            mlflow.log_artifacts(str(adapter), "adapter")
        created = client.create_model_version(
            "conductor", f"{run.info.artifact_uri}/adapter", run_id=run.info.run_id
        )
        client.set_model_version_tag("conductor", created.version, "run_fingerprint", f"fp{i}")
        versions.append(str(created.version))
    return versions
