"""Fixtures of the pipeline tests: the MLflow store and registry for the promotion pipeline."""

from tests.mlflow_store import registry, tracking_uri  # noqa: F401  (fixtures used here)
