"""`kedro run --pipelines training` in a project copy: the node opens the configured sandbox
pool, trains (one SFT and one GRPO step on a tiny model) and registers a `conductor` version."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conductor_pipeline.tasks import Task

REPO = Path(__file__).resolve().parents[2]


def _task(i: int, domain: str) -> Task:
    return Task(
        f"t/{domain}/{i}",
        domain,
        "easy",
        f"Compute {i} plus {i + 3} and give the number.",
        str(2 * i + 3),
        "number",
        "numeric",
        "unit",
    )


@pytest.mark.slow
def test_training_pipeline_runs_through_kedro_and_registers_a_version(
    tmp_path, monkeypatch, tiny_model_dir
):
    root = tmp_path / "project"
    (root / "conf" / "local").mkdir(parents=True)
    (root / "src").mkdir()
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copytree(REPO / "conf" / "base", root / "conf" / "base")
    splits = root / "data" / "05_model_input"
    splits.mkdir(parents=True)
    for offset, name in enumerate(("train", "validation", "test")):
        rows = [
            _task(100 * offset + i, domain).to_record()
            for i in range(4)
            for domain in ("math", "logic")
        ]
        pd.DataFrame(rows).to_parquet(splits / f"{name}_tasks.parquet")

    pool = yaml.safe_load((REPO / "conf/base/workers.yml").read_text())
    pool["worker_pool"]["sandbox"].update(load_real_model=False, latency_scale=0.0)
    pool["worker_pool"]["sandbox"]["workers"] = [
        "sim-sage",
        "sim-abacus",
        "sim-coder",
        "sim-sphinx",
        "sim-sprout",
    ]
    (root / "conf/local/workers.yml").write_text(yaml.safe_dump(pool))
    training = yaml.safe_load((REPO / "conf/base/parameters_training.yml").read_text())
    settings = training["training"]
    settings["base_model"] = str(tiny_model_dir)
    settings["grpo"].update(max_steps=1, save_steps=1, max_completion_length=16)
    settings["sft"].update(max_steps=1, n_examples=4)
    (root / "conf/local/parameters_training.yml").write_text(yaml.safe_dump(training))

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
