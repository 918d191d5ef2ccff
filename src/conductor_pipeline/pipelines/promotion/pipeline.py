"""promotion: the version the evaluation measured (in the default loop: the one training just
registered) → challenger → gates against the champion on the evaluation's figures → decision
tags on the version, champion alias moved if it passed."""

from kedro.pipeline import Node, Pipeline

from conductor_pipeline.pipelines.promotion.nodes import promote_challenger, promotion_metrics


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                promote_challenger,
                [
                    "evaluation_summary",
                    "evaluation_run_info",
                    "evaluation_results",
                    "params:promotion",
                ],
                "promotion_decision",
                name="promote_challenger",
            ),
            Node(
                promotion_metrics,
                "promotion_decision",
                "promotion_metrics",
                name="log_promotion_metrics",
            ),
        ]
    )
