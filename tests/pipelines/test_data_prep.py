"""data_prep: configuration errors name their key; the real pipeline runs and logs to MLflow."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conductor_pipeline.pipelines.data_prep.nodes import validate_params
from conductor_pipeline.tasks.splits import normalise_question

REPO = Path(__file__).resolve().parents[2]


def good_params() -> dict:
    return {
        "seed": 1,
        "sources": {
            "reasoning_gym": {
                "datasets": {
                    "basic_arithmetic": {"count": 10, "domain": "math", "difficulty": "easy"}
                }
            }
        },
        "domain_quota": {"math": 8},
        "split_ratios": {"train": 0.5, "validation": 0.25, "test": 0.25},
    }


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (lambda p: p["split_ratios"].update(train=0.9), "data_prep.split_ratios"),
        (lambda p: p["split_ratios"].pop("validation"), "data_prep.split_ratios"),
        (lambda p: p["split_ratios"].update(test=-0.25, train=1.0), "data_prep.split_ratios.test"),
        (lambda p: p["sources"].update(no_such_source={}), "data_prep.sources.no_such_source"),
        (lambda p: p.update(sead=3), "data_prep: unknown key 'sead' \\(did you mean 'seed'"),
        (lambda p: p["domain_quota"].update(math=0), "data_prep.domain_quota.math"),
    ],
)
def test_malformed_config_fails_fast_naming_the_key(mutate, key):
    params = good_params()
    mutate(params)
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        validate_params(params)


def test_unknown_reasoning_gym_dataset_names_the_key():
    from conductor_pipeline.pipelines.data_prep.nodes import collect_tasks

    params = good_params()
    params["sources"]["reasoning_gym"]["datasets"]["no_such_dataset"] = {
        "count": 3,
        "domain": "math",
        "difficulty": "easy",
    }
    with pytest.raises(ValueError, match=r"data_prep\.sources\.reasoning_gym.*no_such_dataset"):
        collect_tasks(params)


@pytest.fixture
def project_copy(tmp_path, monkeypatch) -> Path:
    """A throw-away copy of the project's configuration, so runs never touch the real store."""
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    shutil.copytree(REPO / "conf", root / "conf", ignore=shutil.ignore_patterns("local"))
    (root / "conf" / "local").mkdir()
    (root / "notebooks").mkdir()
    (
        root / "src"
    ).mkdir()  # Kedro checks that a source folder exists; the package itself is installed
    small = {
        "data_prep": {
            "seed": 3,
            "sources": {
                "reasoning_gym": {
                    "datasets": {
                        "basic_arithmetic": {"count": 20, "domain": "math", "difficulty": "easy"},
                        "syllogism": {"count": 20, "domain": "logic", "difficulty": "easy"},
                    }
                },
                "humaneval": {"limit": 12},
            },
            "domain_quota": {"math": 16, "logic": 16, "code": None},
            "split_ratios": {"train": 0.5, "validation": 0.25, "test": 0.25},
        }
    }
    (root / "conf" / "local" / "parameters_data_prep.yml").write_text(yaml.safe_dump(small))
    monkeypatch.delenv("CONDUCTOR_PROJECT_ROOT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(root)
    return root


def _run(root: Path, pipeline: str = "data_prep") -> None:
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    bootstrap_project(root)
    with KedroSession.create(project_path=root) as session:
        session.run(pipeline_names=[pipeline])


@pytest.mark.slow
def test_data_prep_runs_for_real_and_records_split_statistics_in_mlflow(project_copy):
    _run(project_copy)

    splits = {
        name: pd.read_parquet(project_copy / f"data/05_model_input/{name}_tasks.parquet")
        for name in ("train", "validation", "test")
    }
    assert sum(len(frame) for frame in splits.values()) == 16 + 16 + 12
    owner = {}
    for name, frame in splits.items():
        for question in frame["question"]:
            assert owner.setdefault(normalise_question(question), name) == name
    assert set(splits["test"]["domain"]) == {"math", "logic", "code"}

    db = project_copy / "mlruns" / "mlflow.db"
    assert db.is_file()
    with sqlite3.connect(db) as conn:
        metrics = dict(conn.execute("SELECT key, value FROM metrics").fetchall())
        artifact_uri = conn.execute("SELECT artifact_uri FROM runs").fetchone()[0]
    assert metrics["data_prep_metrics.split.test.n"] == len(splits["test"])
    assert (
        metrics["data_prep_metrics.split.train.domain.math"]
        == (splits["train"]["domain"] == "math").sum()
    )
    assert str(project_copy / "mlruns") in artifact_uri
    artifacts = list((project_copy / "mlruns").rglob("split_statistics.json"))
    assert artifacts, "split statistics were not logged as an artifact"

    # a separate process started in notebooks/ (as a notebook kernel is) reaches the same store
    notebooks = project_copy / "notebooks"
    probe = "from conductor_pipeline.paths import mlflow_tracking_uri; print(mlflow_tracking_uri())"
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=notebooks, capture_output=True, text=True, check=True
    )
    assert found.stdout.strip() == f"sqlite:///{db}"
    subprocess.run(
        [sys.executable, "-m", "kedro", "run", "--pipelines", "data_prep"],
        cwd=notebooks,
        capture_output=True,
        text=True,
        check=True,
    )
    assert not (notebooks / "mlruns").exists()
    assert not (notebooks / "mlflow.db").exists()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 2
