"""`kedro run --pipelines promotion`, then the evaluation report node, in a throw-away copy
of the project: catalog wiring, the optional decision dataset, HTML logged to MLflow."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import mlflow
import pytest

from conductor_pipeline.evaluation import summarise, summarise_by_domain
from tests.mlflow_store import register_adapter
from tests.reporting.conftest import REPO, make_results


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copytree(REPO / "conf", root / "conf", ignore=shutil.ignore_patterns("local"))
    (root / "conf" / "local").mkdir()
    shutil.copytree(REPO / "notebooks", root / "notebooks")
    (root / "src").mkdir()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("CONDUCTOR_PROJECT_ROOT", str(root))
    monkeypatch.chdir(root)
    return root


def _register_version(root: Path) -> str:
    (root / "mlruns").mkdir(exist_ok=True)
    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
    adapter = root / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    version = register_adapter(adapter, root / "mlruns" / "a", experiment="training")
    mlflow.MlflowClient().set_model_version_tag("conductor", version, "run_fingerprint", "fp-1")
    return version


def _write_evaluation(root: Path, version: str) -> None:
    out = root / "data" / "08_reporting"
    out.mkdir(parents=True)
    results = make_results()
    results.to_parquet(out / "evaluation_results.parquet", index=False)
    summarise(results, samples=200).to_csv(out / "evaluation_summary.csv", index=False)
    summarise_by_domain(results, samples=200).to_csv(
        out / "evaluation_summary_by_domain.csv", index=False
    )
    (out / "evaluation_run_info.json").write_text(
        json.dumps({"conductor_variant": f"conductor/{version}", "conductor": "fixture"})
    )


def _kedro_run(root: Path, **kwargs) -> None:
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    bootstrap_project(root)
    with KedroSession.create(project_path=root) as session:
        session.run(**kwargs)


@pytest.mark.slow
def test_promotion_then_the_evaluation_report_through_kedro(project):
    version = _register_version(project)
    _write_evaluation(project, version)

    # before any promotion the report renders and says there is no decision yet
    _kedro_run(project, pipeline_names=["reporting"], node_names=["render_evaluation_report"])
    first = (project / "data" / "08_reporting" / "evaluation_report.html").read_text()
    assert "The promotion decision is not available" in first

    _kedro_run(project, pipeline_names=["promotion"])
    decision = json.loads((project / "data/08_reporting/promotion_decision.json").read_text())
    assert decision["decision"] == "promoted" and decision["version"] == version
    client = mlflow.MlflowClient()
    assert str(client.get_model_version_by_alias("conductor", "champion").version) == version

    _kedro_run(project, pipeline_names=["reporting"], node_names=["render_evaluation_report"])
    html = (project / "data" / "08_reporting" / "evaluation_report.html").read_text()
    assert "decision: <strong>promoted</strong>" in html
    with sqlite3.connect(project / "mlruns" / "mlflow.db") as conn:
        metrics = dict(conn.execute("SELECT key, value FROM metrics").fetchall())
    assert metrics["promotion.promoted"] == 1.0
    logged = list((project / "mlruns").rglob("evaluation_report.html"))
    assert logged, "the report was not logged as an MLflow artifact"
