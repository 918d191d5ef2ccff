"""retraining: lock → data_prep on fresh data (configured sources + logged questions) →
training from the champion's adapter → evaluation → promotion → reports → unlock. Composed
from the other pipelines, so a change to any stage reaches the scheduled run too."""

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
        + training.create_pipeline(start_from="params:retraining.start_from")
        + evaluation.create_pipeline(after_training=True)
        + promotion.create_pipeline()
        + reporting.create_pipeline()
    )
