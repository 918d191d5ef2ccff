"""The MLflow-backed watermark store: tags on one experiment of the tracking store, read back
by another client (another process, e.g. the next Airflow task)."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from conductor_pipeline.pipelines.retraining.watermarks import MlflowWatermarks, watermark_store
from conductor_pipeline.tasks.sources.dropfolder import FileWatermarks, commit, read_drop_folder
from conductor_pipeline.tasks.sources.growing import WatermarkSettings


def test_watermarks_are_experiment_tags_shared_by_every_client(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = MlflowWatermarks("conductor-retraining", tracking_uri=uri, root=tmp_path)
    assert store.read("drop_folder") is None  # no experiment yet: nothing created by a read
    assert MlflowClient(tracking_uri=uri).get_experiment_by_name("conductor-retraining") is None

    folder = tmp_path / "drop"
    folder.mkdir()
    (folder / "a.jsonl").write_text(
        '{"question": "Compute 1 + 1.", "answer": "2", "answer_format": "number",'
        ' "verifier": "numeric"}\n'
    )
    batch = read_drop_folder(folder, store.read("drop_folder"))
    assert len(batch.tasks) == 1 and commit(store, batch)

    other = MlflowWatermarks("conductor-retraining", tracking_uri=uri, root=tmp_path)
    assert other.read("drop_folder") == batch.watermark
    assert read_drop_folder(folder, other.read("drop_folder")).unchanged
    tags = MlflowClient(tracking_uri=uri).get_experiment_by_name("conductor-retraining").tags
    assert tags["watermark.drop_folder"] == batch.watermark
    assert tags["watermark.drop_folder.updated"].endswith("Z")


def test_an_oversized_watermark_says_what_to_do(tmp_path):
    store = MlflowWatermarks(
        "conductor-retraining", tracking_uri=f"sqlite:///{tmp_path / 'm.db'}", root=tmp_path
    )
    with pytest.raises(ValueError, match="store: file"):
        store.write("drop_folder", "x" * 30_000)


def test_the_settings_pick_the_store(tmp_path):
    chosen = watermark_store(WatermarkSettings(store="file", path="w.json"), tmp_path)
    assert isinstance(chosen, FileWatermarks) and chosen.path == tmp_path / "w.json"
    default = watermark_store(WatermarkSettings(), tmp_path)
    assert isinstance(default, MlflowWatermarks) and default.experiment == "conductor-retraining"
    assert default.tracking_uri == f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
