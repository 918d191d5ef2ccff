"""data_prep: sources → raw tasks → unique tasks → balanced, stratified splits (+ statistics in MLflow)."""

from kedro.pipeline import Node, Pipeline

from conductor_pipeline.pipelines.data_prep.nodes import (
    collect_tasks,
    deduplicate_tasks,
    make_splits,
    summarise_splits,
)


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(collect_tasks, "params:data_prep", "raw_tasks", name="collect_tasks"),
            Node(
                deduplicate_tasks,
                "raw_tasks",
                ["unique_tasks", "dedup_report"],
                name="deduplicate_tasks",
            ),
            Node(
                make_splits,
                ["unique_tasks", "params:data_prep"],
                ["train_tasks", "validation_tasks", "test_tasks", "balance_report"],
                name="make_splits",
            ),
            Node(
                summarise_splits,
                ["train_tasks", "validation_tasks", "test_tasks", "dedup_report", "balance_report"],
                ["split_statistics", "data_prep_metrics"],
                name="summarise_splits",
            ),
        ]
    )
