"""reporting: training and evaluation outputs → papermill notebooks → HTML reports (MLflow).

The evaluation report takes the promotion decision, so in ``__default__`` and
``retraining`` it renders after the promotion pipeline has decided.
"""

from kedro.pipeline import Node, Pipeline

from conductor_pipeline.pipelines.reporting.nodes import (
    render_evaluation_report,
    render_training_report,
)


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                render_training_report,
                [
                    "conductor_model_version",
                    "conductor_adapter_info",
                    "training_history",
                    "params:reporting",
                ],
                "training_report",
                name="render_training_report",
            ),
            Node(
                render_evaluation_report,
                [
                    "evaluation_summary",
                    "evaluation_summary_by_domain",
                    "evaluation_results",
                    "evaluation_run_info",
                    "promotion_decision",
                    "params:reporting",
                ],
                "evaluation_report",
                name="render_evaluation_report",
            ),
        ]
    )
