"""evaluation: the Conductor and the baselines on the test split → per-question results →
summary tables, cost–accuracy plot and metrics (MLflow), the Conductor systems' routing
(answer workers, workflow shapes) per domain → traces of sample questions."""

from kedro.pipeline import Node, Pipeline

from conductor_pipeline.pipelines.evaluation.nodes import (
    log_conductor_traces,
    run_evaluation,
    summarise_evaluation,
    summarise_routing,
)


def create_pipeline(*, after_training: bool = False, **kwargs) -> Pipeline:
    """``after_training=True`` (the default pipeline): evaluate the version the training
    pipeline just registered (its ``conductor_model_version`` output), which also orders
    evaluation after training. Alone, the Conductor is ``conductor.policy.adapter`` (or
    ``evaluation.conductor.adapter``)."""
    candidate = ["conductor_model_version"] if after_training else []
    return Pipeline(
        [
            Node(
                run_evaluation,
                [
                    "test_tasks",
                    "train_tasks",
                    "validation_tasks",
                    "worker_pool_config",
                    "worker_credentials",
                    "params:conductor",
                    "params:evaluation",
                    "params:serving",
                    *candidate,
                ],
                ["evaluation_results", "evaluation_run_info"],
                name="run_evaluation",
            ),
            Node(
                summarise_evaluation,
                ["evaluation_results", "params:evaluation"],
                [
                    "evaluation_summary",
                    "evaluation_summary_by_domain",
                    "evaluation_pareto_plot",
                    "evaluation_metrics",
                ],
                name="summarise_evaluation",
            ),
            Node(
                summarise_routing,
                ["evaluation_results", "params:evaluation"],
                "evaluation_routing",
                name="summarise_routing",
            ),
            Node(
                log_conductor_traces,
                ["evaluation_results", "params:evaluation"],
                "evaluation_traces",
                name="log_conductor_traces",
            ),
        ]
    )
