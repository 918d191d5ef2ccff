"""A project that is moved or cloned keeps working: the MLflow store is re-rooted under the
new checkout and registered adapters name their base model relative to the project.
Also: MLflow run names and registered-version descriptions."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import mlflow
import pytest

from conductor_pipeline.paths import reroot
from conductor_pipeline.registry import (
    describe_version,
    portable_adapter,
    rebase_store,
    resolve_adapter,
    run_name,
)
from conductor_pipeline.training.configs import SMOLLM2
from conductor_pipeline.workers.local_model import DEFAULT_CACHE_RELATIVE
from tests.mlflow_store import register_adapter
from tests.path_scan import old_path_mentions
from tests.training.project_copy import write_training_project

REPO = Path(__file__).resolve().parents[1]


# -- unit: path re-rooting, names, descriptions -------------------------------------------------


def test_reroot_moves_paths_and_uris_of_another_checkout(tmp_path):
    new = tmp_path / "new"
    assert reroot("file:///old/p/mlruns/artifacts/1/a", new, "mlruns") == (
        f"file://{new.resolve()}/mlruns/artifacts/1/a"
    )
    assert reroot("/old/p/mlruns/0", new, "mlruns") == f"{new.resolve()}/mlruns/0"
    # the last marker wins: an old root that itself sits under a folder named mlruns
    assert reroot("/x/mlruns/p/mlruns/a", new, "mlruns") == f"{new.resolve()}/mlruns/a"
    assert reroot(f"file://{new.resolve()}/mlruns/a", new, "mlruns") is None  # in place
    assert reroot("mlflow-artifacts:/0/abc", new, "mlruns") is None  # not a local path
    assert reroot("models:/m-123", new, "mlruns") is None
    assert reroot("/somewhere/else/file", new, "mlruns") is None


def test_run_name_says_pipeline_time_and_version():
    started = datetime(2026, 12, 1, 23, 5, tzinfo=timezone(timedelta(hours=1)))
    assert run_name(["__default__"], started) == "__default__ 2026-12-01 22:05 UTC"
    assert run_name(["training", "evaluation"], started, "3") == (
        "training+evaluation 2026-12-01 22:05 UTC → conductor v3"
    )
    with pytest.raises(ValueError, match="timezone-aware"):
        run_name(["training"], datetime(2026, 1, 1))


def test_describe_version_names_data_steps_and_pool():
    info = json.loads((REPO / "tests/fixtures/adapter_info_sample.json").read_text())
    text = describe_version(info)
    assert "GRPO for 14 step(s)" in text
    assert "train split d018c4fc2c58, 288 prompts" in text
    assert "SFT for 30 step(s) on 48 examples, final loss 0.115" in text
    assert "sim-sage" in text and "5.5 min" in text
    with pytest.raises(KeyError, match="data_version"):
        describe_version({"base_model": "x", "global_step": 1})


# -- a small store built by hand, then moved -----------------------------------------------------


def _store_with_champion(root: Path) -> None:
    """A project at ``root`` with a base model under data/, one registered adapter whose
    config names that base by absolute path (as PEFT writes it), alias champion."""
    (root / "conf").mkdir(parents=True)
    shutil.copy(REPO / "pyproject.toml", root)
    base = root / "data/06_models/base"
    base.mkdir(parents=True)
    (base / "config.json").write_text("{}")
    adapter = root / "data/06_models/conductor/adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    (root / "mlruns").mkdir()
    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
    version = register_adapter(adapter, root / "mlruns" / "artifacts", experiment="conductor")
    mlflow.MlflowClient().set_registered_model_alias("conductor", "champion", version)
    # mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI; a fresh process in the moved
    # copy would not have it
    mlflow.set_tracking_uri(None)
    os.environ.pop("MLFLOW_TRACKING_URI", None)


def _locations(database: Path) -> list[str]:
    with sqlite3.connect(database) as conn:
        rows = conn.execute("SELECT artifact_location FROM experiments").fetchall()
        rows += conn.execute("SELECT artifact_uri FROM runs").fetchall()
        rows += conn.execute("SELECT source FROM model_versions").fetchall()
    return [r[0] for r in rows]


@pytest.fixture
def isolated(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("CONDUCTOR_PROJECT_ROOT", raising=False)
    yield monkeypatch
    mlflow.set_tracking_uri(None)


def test_moved_store_resolves_the_champion_inside_the_copy(tmp_path, isolated):
    old, new = tmp_path / "old", tmp_path / "new"
    _store_with_champion(old)
    shutil.move(old, new)
    isolated.chdir(new)

    adapter = Path(resolve_adapter("models:/conductor@champion"))
    assert adapter.resolve().is_relative_to(new.resolve()), adapter
    config = json.loads((adapter / "adapter_config.json").read_text())
    # relative to the project root, and that base exists in the moved copy
    assert config["base_model_name_or_path"] == "data/06_models/base"
    assert (new / config["base_model_name_or_path"]).is_dir()
    locations = _locations(new / "mlruns" / "mlflow.db")
    assert locations and not any(str(old) in loc for loc in locations), locations
    assert rebase_store(new) == 0  # in place now: nothing more to write

    # a new run in the moved project writes its artifacts into the copy
    with mlflow.start_run(experiment_id=mlflow.get_experiment_by_name("conductor").experiment_id):
        uri = mlflow.get_artifact_uri().removeprefix("file://")
        assert uri.startswith(f"{new.resolve()}/mlruns/"), uri


def test_a_foreign_tracking_store_is_never_rewritten(tmp_path, isolated):
    old, new = tmp_path / "old", tmp_path / "new"
    _store_with_champion(old)
    shutil.move(old, new)
    isolated.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'team.db'}")
    assert rebase_store(new) == 0
    assert any(str(old) in loc for loc in _locations(new / "mlruns" / "mlflow.db"))


def test_portable_adapter_leaves_hub_ids_and_outside_paths(tmp_path):
    root = tmp_path / "p"
    for name, base in (("a", "HuggingFaceTB/SmolLM2-135M-Instruct"), ("b", "/opt/models/x")):
        (root / name).mkdir(parents=True)
        (root / name / "adapter_config.json").write_text(
            json.dumps({"base_model_name_or_path": base})
        )
    assert portable_adapter(root, root) == 0


# -- end to end: kedro training run, move, resolve, generate -------------------------------------


def _training_project(root: Path, tiny_model_dir: Path) -> Path:
    # the tiny model stands in for the offline SmolLM2 copy, where that lives in the project
    # (data/06_models): the configured short name resolves to its absolute path, as in a
    # real run, and PEFT writes that path into every checkpoint
    base = root / DEFAULT_CACHE_RELATIVE
    shutil.copytree(tiny_model_dir, base)
    write_training_project(root, SMOLLM2, workers=["sim-sage", "sim-abacus", "sim-sprout"])
    return base


@pytest.mark.slow
def test_trained_project_moved_then_champion_resolves_and_generates(
    tmp_path, isolated, tiny_model_dir
):
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    from conductor_pipeline.workflow import LocalPolicy

    old, new = tmp_path / "old", tmp_path / "new"
    _training_project(old, tiny_model_dir)
    isolated.delenv("CONDUCTOR_MODEL_CACHE", raising=False)  # the project's own copy
    isolated.chdir(old)
    bootstrap_project(old)
    before = datetime.now(UTC).replace(second=0, microsecond=0)
    with KedroSession.create(project_path=old) as session:
        session.run(pipeline_names=["training"])
    while mlflow.active_run() is not None:  # left open by the in-process session
        mlflow.end_run()

    client = mlflow.MlflowClient(f"sqlite:///{old / 'mlruns' / 'mlflow.db'}")
    version = client.get_model_version("conductor", "1")
    # the run is named after its pipeline, start time and the version it registered
    run = client.get_run(version.run_id)
    stamp = datetime.strptime(run.info.run_name.split(" UTC")[0][-16:], "%Y-%m-%d %H:%M")
    assert run.info.run_name.startswith("training ")
    assert run.info.run_name.endswith("UTC → conductor v1"), run.info.run_name
    assert stamp.replace(tzinfo=UTC) >= before
    # the version says what was trained, on which data
    data_version = version.tags["data_version"]
    assert f"train split {data_version}" in version.description
    assert "GRPO for 1 step(s)" in version.description
    client.set_registered_model_alias("conductor", "champion", "1")
    mlflow.set_tracking_uri(None)
    isolated.delenv("MLFLOW_TRACKING_URI", raising=False)

    shutil.move(old, new)
    assert not old.exists()
    isolated.chdir(new)
    adapter = Path(resolve_adapter("models:/conductor@champion"))
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == DEFAULT_CACHE_RELATIVE.as_posix()
    base = new / config["base_model_name_or_path"]
    policy = LocalPolicy(model_dir=base, adapter_dir=adapter)
    completion = asyncio.run(
        policy.complete(
            [{"role": "user", "content": "What is 2 + 2?"}], temperature=0.0, max_tokens=4, seed=0
        )
    )
    assert completion.text is not None
    assert not any(str(old) in loc for loc in _locations(new / "mlruns" / "mlflow.db"))
    # nothing else names the old folder either: the run's tags, the logged model's MLmodel,
    # the checkpoints' and SFT adapter's configs and model cards
    mentions = old_path_mentions(new, old)
    assert not mentions, "\n".join(mentions)


def test_kedro_in_a_moved_project_opens_the_rerooted_experiment(tmp_path, isolated):
    # the hook re-roots the store before kedro-mlflow reads the experiment, whose stored
    # artifact location decides where the run's artifacts go
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    old, new = tmp_path / "old", tmp_path / "new"
    _store_with_champion(old)
    shutil.copytree(REPO / "conf" / "base", old / "conf" / "base")
    (old / "conf" / "local").mkdir()
    (old / "src").mkdir()
    shutil.move(old, new)
    isolated.chdir(new)
    bootstrap_project(new)
    with KedroSession.create(project_path=new) as session:
        context = session.load_context()
        experiment = context.mlflow.tracking.experiment._experiment
    assert experiment.name == "conductor"
    assert (
        experiment.artifact_location.removeprefix("file://") == f"{new.resolve()}/mlruns/artifacts"
    )
