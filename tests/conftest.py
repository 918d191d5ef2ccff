"""Test configuration: offline by default, and never the project's own MLflow store."""

from __future__ import annotations

import os

# Set before any test module imports litellm, transformers, datasets or kedro.
_OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "KEDRO_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
os.environ.update(_OFFLINE)


import sys  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def isolated_mlflow_store(tmp_path_factory, monkeypatch):
    """Each test that touches MLflow without choosing a store gets a throw-away one."""
    store = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    yield
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None:
        # a run left open (e.g. by an in-process Kedro session) would be adopted by the next test
        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(f"sqlite:///{store}")  # undo the test's or kedro-mlflow's choice
