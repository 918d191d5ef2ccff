"""training: train split → SFT warm start + GRPO (+ recursion) → adapter → registered model."""

from kedro.pipeline import Node, Pipeline

from conductor_pipeline.pipelines.training.nodes import register_conductor, train_conductor_node


def create_pipeline(start_from: str | None = None, **kwargs) -> Pipeline:
    """``start_from``: a ``params:`` input naming the adapter to continue from (retraining
    passes ``params:retraining.start_from``); without it training starts from the base model."""
    inputs = [
        "train_tasks",
        "params:training",
        "params:conductor.prompt",
        "worker_pool_config",
        "worker_credentials",
    ]
    return Pipeline(
        [
            Node(
                train_conductor_node,
                inputs + ([start_from] if start_from else []),
                ["conductor_adapter_info", "training_history", "sft_history"],
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
