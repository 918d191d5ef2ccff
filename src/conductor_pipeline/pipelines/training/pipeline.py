"""training: train split → SFT warm start + GRPO (+ recursion) → adapter → registered model."""

from kedro.pipeline import Node, Pipeline

from conductor_pipeline.pipelines.training.nodes import register_conductor, train_conductor_node


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                train_conductor_node,
                ["train_tasks", "params:training", "worker_pool_config", "worker_credentials"],
                ["conductor_adapter_info", "training_history"],
                name="train_conductor",
            ),
            Node(
                register_conductor,
                "conductor_adapter_info",
                "conductor_model_version",
                name="register_conductor",
            ),
        ]
    )
