"""retraining: lock → data_prep on fresh data (configured sources + logged questions) →
what is new in the growing sources (served traffic with feedback, drop folder, LiveCodeBench)
joins the training split, the new evaluation slice beside it → training from the champion's
adapter → evaluation on the fixed test split, and of challenger and champion on the new
slice → promotion gated on both → reports → watermarks committed → unlock. Composed from the
other pipelines, so a change to any stage reaches the scheduled run too."""

from kedro.pipeline import Node, Pipeline

from conductor_pipeline.pipelines import (
    data_prep,
    evaluation,
    promotion,
    reporting,
    training,
)
from conductor_pipeline.pipelines.retraining.nodes import (
    acquire_lock,
    add_logged_questions,
    release_lock,
)
from conductor_pipeline.pipelines.retraining.sources import (
    collect_retraining_sources,
    commit_source_watermarks,
    evaluate_traffic_slice,
)

# the training split with the growing sources' new tasks: what training and evaluation read
_TRAIN = {"train_tasks": "retraining_train_tasks"}


def _growing_sources() -> Pipeline:
    return Pipeline(
        [
            Node(
                collect_retraining_sources,
                [
                    "train_tasks",
                    "test_tasks",
                    "retraining_lock",
                    "params:retraining_sources",
                    "validation_tasks",
                ],
                ["retraining_train_tasks", "traffic_slice_tasks", "retraining_sources_report"],
                name="collect_retraining_sources",
            ),
            Node(
                evaluate_traffic_slice,
                [
                    "traffic_slice_tasks",
                    "retraining_train_tasks",
                    "validation_tasks",
                    "worker_pool_config",
                    "worker_credentials",
                    "params:conductor",
                    "params:evaluation",
                    "params:serving",
                    "conductor_model_version",
                ],
                ["traffic_slice_results", "traffic_slice_figures"],
                name="evaluate_traffic_slice",
            ),
            Node(
                commit_source_watermarks,
                [
                    "retraining_sources_report",
                    "promotion_decision",
                    "training_report",
                    "evaluation_report",
                    "params:retraining_sources",
                ],
                "retraining_watermarks",
                name="commit_source_watermarks",
            ),
        ]
    )


def create_pipeline(**kwargs) -> Pipeline:
    prep = data_prep.create_pipeline()
    collect = Pipeline(
        prep.only_nodes("collect_tasks"), outputs={"raw_tasks": "configured_raw_tasks"}
    )
    rest_of_prep = prep.from_nodes("deduplicate_tasks")
    bookends = Pipeline(
        [
            Node(
                acquire_lock, "params:retraining", "retraining_lock", name="acquire_retraining_lock"
            ),
            Node(
                add_logged_questions,
                ["configured_raw_tasks", "retraining_lock", "params:retraining"],
                ["raw_tasks", "logged_questions_summary"],
                name="add_logged_questions",
            ),
            Node(
                release_lock,
                [
                    "retraining_lock",
                    "promotion_decision",
                    "training_report",
                    "evaluation_report",
                    "logged_questions_summary",
                    "params:retraining",
                    "retraining_watermarks",
                ],
                "retraining_report",
                name="release_retraining_lock",
            ),
        ]
    )
    return (
        bookends
        + collect
        + rest_of_prep
        + _growing_sources()
        + Pipeline(
            training.create_pipeline(start_from="params:retraining.start_from"), inputs=_TRAIN
        )
        + Pipeline(evaluation.create_pipeline(after_training=True), inputs=_TRAIN)
        + promotion.create_pipeline(new_slice="traffic_slice_figures")
        + reporting.create_pipeline()
    )
