"""Where the serving tracer's experiment keeps its artifacts: the project's store gets them
under mlruns/artifacts whether MLFLOW_TRACKING_URI is unset or names that same store (as the
Makefile exports it); another store keeps MLflow's default location."""

from __future__ import annotations

from pathlib import Path

import mlflow
from mlflow import MlflowClient

from conductor_pipeline.paths import mlflow_tracking_uri
from conductor_pipeline.serving.server import mlflow_tracer


def _artifact_location(uri: str, experiment: str) -> str:
    return MlflowClient(tracking_uri=uri).get_experiment_by_name(experiment).artifact_location


def test_the_project_store_named_in_the_environment_keeps_artifacts_in_mlruns(
    tmp_path, monkeypatch
):
    root = tmp_path / "project"
    (root / "mlruns").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # MLflow's default artifact root is relative to the cwd
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_tracking_uri(root))

    mlflow_tracer(root, "serving-traces")

    location = _artifact_location(mlflow_tracking_uri(root), "serving-traces")
    assert Path(location.removeprefix("file://")) == root / "mlruns" / "artifacts"


def test_another_store_keeps_mlflow_s_default_location(tmp_path, monkeypatch):
    root = tmp_path / "project"
    root.mkdir()
    monkeypatch.chdir(tmp_path)
    team_store = f"sqlite:///{tmp_path / 'team.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", team_store)
    mlflow.set_tracking_uri(team_store)  # as a fresh process reads it from the environment

    mlflow_tracer(root, "serving-traces")

    location = _artifact_location(team_store, "serving-traces")
    assert "mlruns/artifacts" not in location
    assert not (root / "mlruns").exists()
