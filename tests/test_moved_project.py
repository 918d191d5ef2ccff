"""A moved or copied project shows no path of its old folder: ``make`` makes a ``.venv`` of
another folder again, and nothing the pipeline stores under ``data/`` and ``mlruns/`` (tags,
adapter configs and model cards, executed report notebooks, run info) names the old root."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import mlflow
import pytest

from conductor_pipeline.evaluation import summarise, summarise_by_domain
from conductor_pipeline.paths import mlflow_tracking_uri, project_relative
from conductor_pipeline.registry import resolve_adapter
from conductor_pipeline.workflow.adapter_base import check_adapter_base
from tests.mlflow_store import register_adapter
from tests.path_scan import old_path_mentions
from tests.reporting.conftest import make_results

REPO = Path(__file__).resolve().parents[1]


# -- make: a .venv made for another folder -----------------------------------------------------


def _project_with_venv(root: Path, made_for: str) -> Path:
    """A project at ``root`` whose installed ``.venv`` (stamp newer than the Makefile) says,
    as ``python -m venv`` writes it, that it was made for ``made_for``."""
    (root / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(REPO / "Makefile", root)
    shutil.copy(REPO / "pyproject.toml", root)
    (root / ".venv" / "bin" / "activate").write_text(
        f'# This file must be used with "source bin/activate"\nVIRTUAL_ENV="{made_for}"\nexport VIRTUAL_ENV\n'
    )
    (root / ".venv" / ".installed").touch()
    return root


def _make_dry_run(root: Path) -> str:
    done = subprocess.run(
        ["make", "-n", "install"], cwd=root, capture_output=True, text=True, check=True
    )
    return done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")
def test_make_rebuilds_a_venv_made_for_another_folder(tmp_path):
    root = _project_with_venv(tmp_path / "new", "/old/place/.venv")
    plan = _make_dry_run(root)
    assert "was made for /old/place/.venv" in plan, plan
    assert "rm -rf .venv" in plan
    assert "-m venv .venv" in plan

    # the same .venv where it was made: nothing to do
    (root / ".venv" / "bin" / "activate").write_text(
        f"VIRTUAL_ENV='{root.resolve()}/.venv'\nexport VIRTUAL_ENV\n"
    )
    assert "Nothing to be done" in _make_dry_run(root)


# -- unit: project-relative paths --------------------------------------------------------------


def test_project_relative_keeps_outside_paths(tmp_path):
    root = tmp_path / "p"
    (root / "data").mkdir(parents=True)
    assert project_relative(root / "data" / "x.json", root) == "data/x.json"
    assert project_relative(str(root), root) == "."
    assert project_relative("/opt/models/base", root) == "/opt/models/base"
    assert project_relative("data/x.json", root) == "data/x.json"


# -- end to end: report and tags through kedro, move, nothing names the old folder --------------

# the front matter PEFT writes into an adapter's model card
_CARD = (
    "---\nbase_model: {base}\nlibrary_name: peft\ntags:\n- base_model:adapter:{base}\n- lora\n---\n"
)


def _project(root: Path) -> None:
    """A project copy at ``root`` with a local base model under data/, a trained adapter
    whose config and card name that base by absolute path (as PEFT writes them), the
    adapter registered in the project's store, and evaluation outputs to report on."""
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copytree(REPO / "conf", root / "conf", ignore=shutil.ignore_patterns("local"))
    (root / "conf" / "local").mkdir()
    shutil.copytree(REPO / "notebooks", root / "notebooks")
    (root / "src").mkdir()
    base = root / "data" / "06_models" / "base"
    base.mkdir(parents=True)
    (base / "config.json").write_text("{}")
    adapter = root / "data" / "06_models" / "conductor" / "runs" / "r1" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    (adapter / "README.md").write_text(_CARD.format(base=base))

    (root / "mlruns").mkdir()
    mlflow.set_tracking_uri(mlflow_tracking_uri(root))
    version = register_adapter(adapter, root / "mlruns" / "artifacts", experiment="conductor")
    mlflow.MlflowClient().set_model_version_tag("conductor", version, "run_fingerprint", "fp-1")

    out = root / "data" / "08_reporting"
    out.mkdir()
    results = make_results()
    results.to_parquet(out / "evaluation_results.parquet", index=False)
    summarise(results, samples=200).to_csv(out / "evaluation_summary.csv", index=False)
    summarise_by_domain(results, samples=200).to_csv(
        out / "evaluation_summary_by_domain.csv", index=False
    )
    (out / "evaluation_run_info.json").write_text(
        json.dumps({"conductor_variant": f"conductor/{version}", "conductor": "fixture"})
    )


def _kedro_run(root: Path, monkeypatch, **kwargs) -> None:
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    monkeypatch.setenv("CONDUCTOR_PROJECT_ROOT", str(root))
    monkeypatch.chdir(root)
    bootstrap_project(root)
    with KedroSession.create(project_path=root) as session:
        session.run(**kwargs)
    while mlflow.active_run() is not None:  # left open by the in-process session
        mlflow.end_run()
    # a fresh process in another folder would not have the URI kedro-mlflow exported
    mlflow.set_tracking_uri(None)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.mark.slow
def test_moved_project_names_no_old_folder_and_still_reports(tmp_path, monkeypatch):
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    old, new = tmp_path / "before-move", tmp_path / "after-move"
    _project(old)
    mlflow.set_tracking_uri(None)
    # a kedro run (the project_path tag) that executes the evaluation report notebook
    _kedro_run(
        old, monkeypatch, pipeline_names=["reporting"], node_names=["render_evaluation_report"]
    )
    assert (old / "data/08_reporting/evaluation_report.ipynb").is_file()

    shutil.move(old, new)
    monkeypatch.setenv("CONDUCTOR_PROJECT_ROOT", str(new))
    monkeypatch.chdir(new)
    bootstrap_project(new)
    with KedroSession.create(project_path=new) as session:
        session.load_context()  # what any kedro command does first: the hooks see the move
    mlflow.set_tracking_uri(None)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    mentions = old_path_mentions(new, old)
    assert not mentions, "\n".join(mentions)
    # the registered adapter still resolves, on the base model inside the moved copy
    adapter = Path(resolve_adapter("models:/conductor/1"))
    assert adapter.resolve().is_relative_to(new.resolve())
    check_adapter_base(adapter, str(new / "data/06_models/base"), where="test", root=new)
    base = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert (new / base / "config.json").is_file()

    # the report renders again from the new place
    report = new / "data/08_reporting/evaluation_report.html"
    report.unlink()
    _kedro_run(
        new, monkeypatch, pipeline_names=["reporting"], node_names=["render_evaluation_report"]
    )
    assert "The promotion decision is not available" in report.read_text()
    assert not old_path_mentions(new, old)
