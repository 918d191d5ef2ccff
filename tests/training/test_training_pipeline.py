"""`kedro run --pipelines training` in a project copy: the node opens the configured sandbox
pool, trains (one SFT and one GRPO step on a tiny model) and registers a `conductor` version."""

from __future__ import annotations

import sqlite3

import pytest

from tests.training.project_copy import write_training_project


@pytest.mark.slow
def test_training_pipeline_runs_through_kedro_and_registers_a_version(
    tmp_path, monkeypatch, tiny_model_dir
):
    root = tmp_path / "project"
    write_training_project(
        root,
        tiny_model_dir,
        workers=["sim-sage", "sim-abacus", "sim-coder", "sim-sphinx", "sim-sprout"],
    )

    monkeypatch.delenv("CONDUCTOR_PROJECT_ROOT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(root)
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    bootstrap_project(root)
    with KedroSession.create(project_path=root) as session:
        session.run(pipeline_names=["training"])

    with sqlite3.connect(root / "mlruns" / "mlflow.db") as conn:
        versions = conn.execute("SELECT name, version FROM model_versions").fetchall()
        metric_keys = {key for (key,) in conn.execute("SELECT DISTINCT key FROM metrics")}
    assert versions == [("conductor", 1)]
    assert any("reward" in key for key in metric_keys), metric_keys
