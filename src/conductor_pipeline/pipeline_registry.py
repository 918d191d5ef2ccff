"""The project's pipelines. ``__default__`` grows with each stage of the loop."""

from __future__ import annotations

from kedro.pipeline import Pipeline

from conductor_pipeline.pipelines import data_prep, evaluation


def register_pipelines() -> dict[str, Pipeline]:
    pipelines = {"data_prep": data_prep.create_pipeline()}
    pipelines["evaluation"] = evaluation.create_pipeline()
    pipelines["__default__"] = pipelines["data_prep"]
    return pipelines
