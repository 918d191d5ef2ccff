"""promotion: the version the evaluation measured (in the default loop: the one training just
registered) → challenger → gates against the champion on the evaluation's figures (and, in
retraining, on the new slice of served questions) → decision
tags on the version, champion alias moved if it passed."""

from kedro.pipeline import Node, Pipeline

from conductor_pipeline.pipelines.promotion.nodes import promote_challenger, promotion_metrics


def create_pipeline(new_slice: str | None = None, **kwargs) -> Pipeline:
    """``new_slice``: a dataset of both versions' figures on a second evaluation slice (the
    retraining pipeline's ``traffic_slice_figures``), gated next to the fixed test set."""
    return Pipeline(
        [
            Node(
                promote_challenger,
                [
                    "evaluation_summary",
                    "evaluation_run_info",
                    "evaluation_results",
                    "params:promotion",
                    *([new_slice] if new_slice else []),
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
