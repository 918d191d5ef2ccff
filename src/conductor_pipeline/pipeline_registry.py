"""The project's pipelines. ``__default__`` grows with each stage of the loop."""

from __future__ import annotations

from kedro.pipeline import Pipeline

from conductor_pipeline.pipelines import (
    data_prep,
    evaluation,
    promotion,
    reporting,
    retraining,
    training,
)


def register_pipelines() -> dict[str, Pipeline]:
    pipelines = {"data_prep": data_prep.create_pipeline()}
    pipelines["training"] = training.create_pipeline()
    pipelines["evaluation"] = evaluation.create_pipeline()
    pipelines["__default__"] = pipelines["data_prep"] + pipelines["training"]
    # the default loop evaluates the version training has just registered
    pipelines["__default__"] += evaluation.create_pipeline(after_training=True)
    pipelines["promotion"] = promotion.create_pipeline()
    pipelines["reporting"] = reporting.create_pipeline()
    # the evaluation report shows the promotion decision, so it renders after promotion
    pipelines["__default__"] += pipelines["promotion"] + pipelines["reporting"]
    pipelines["retraining"] = retraining.create_pipeline()
    return pipelines
