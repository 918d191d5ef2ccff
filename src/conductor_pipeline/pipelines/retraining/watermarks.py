"""Watermarks of the growing retraining sources, kept in MLflow.

``conductor_pipeline.tasks.sources.dropfolder`` defines the interface (``read(source)``,
``write(source, value)``) and a plain-file store; the tasks package imports no MLflow, so
the MLflow-backed store lives here, on the pipeline side. Each source's watermark is the tag
``watermark.<source>`` of the experiment ``retraining_sources.watermarks.experiment``
(default ``conductor-retraining``) in the project's tracking store: visible in the MLflow UI
next to the runs that moved it, and shared by every process that reaches the store (an
Airflow task, the CLI). ``watermark.<source>.updated`` records when it last moved.
"""

from __future__ import annotations

import time
from pathlib import Path

from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_EXPERIMENT_TAG_VAL_LENGTH

from conductor_pipeline.paths import mlflow_tracking_uri, project_root
from conductor_pipeline.tasks.sources.dropfolder import FileWatermarks, WatermarkStore
from conductor_pipeline.tasks.sources.growing import WatermarkSettings

TAG_PREFIX = "watermark."


class MlflowWatermarks:
    """Watermarks as tags of one MLflow experiment (created on the first write)."""

    def __init__(
        self, experiment: str, *, tracking_uri: str | None = None, root: Path | None = None
    ) -> None:
        self.root = root or project_root()
        self.tracking_uri = tracking_uri or mlflow_tracking_uri(self.root)
        self.experiment = experiment
        self._client: MlflowClient | None = None

    @property
    def client(self) -> MlflowClient:
        # opened on first use: building the store (at node set-up) touches no database
        if self._client is None:
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def _experiment_id(self, create: bool) -> str | None:
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        if not create:
            return None
        # the project's artifact root, as kedro-mlflow's experiment has (conf/base/mlflow.yml)
        return self.client.create_experiment(
            self.experiment, artifact_location=str(self.root / "mlruns" / "artifacts")
        )

    def read(self, source: str) -> str | None:
        experiment_id = self._experiment_id(create=False)
        if experiment_id is None:
            return None
        return self.client.get_experiment(experiment_id).tags.get(TAG_PREFIX + source)

    def write(self, source: str, value: str) -> None:
        if len(value) > MAX_EXPERIMENT_TAG_VAL_LENGTH:
            raise ValueError(
                f"watermark of {source!r} is {len(value)} characters, over MLflow's "
                f"{MAX_EXPERIMENT_TAG_VAL_LENGTH} for a tag: use retraining_sources.watermarks."
                "store: file, or fewer files in the drop folder"
            )
        experiment_id = self._experiment_id(create=True)
        assert experiment_id is not None
        self.client.set_experiment_tag(experiment_id, TAG_PREFIX + source, value)
        self.client.set_experiment_tag(
            experiment_id,
            f"{TAG_PREFIX}{source}.updated",
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )


def watermark_store(settings: WatermarkSettings, root: Path | None = None) -> WatermarkStore:
    """The store ``retraining_sources.watermarks`` names."""
    root = root or project_root()
    if settings.store == "file":
        path = Path(settings.path)
        return FileWatermarks(path if path.is_absolute() else root / path)
    return MlflowWatermarks(settings.experiment, root=root)
