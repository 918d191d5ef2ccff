"""training: train split → SFT warm start + GRPO (+ recursion) → adapter → registered model."""

from kedro.pipeline import Node, Pipeline

from conductor_pipeline.pipelines.training.nodes import register_conductor, train_conductor_node


def create_pipeline(start_from: str | None = None, **kwargs) -> Pipeline:
    """``start_from``: a ``params:`` input naming the adapter to continue from (retraining
    passes ``params:retraining.start_from``); without it training starts from the base model.
    ``params:stages.training.own_process``: whether the training work runs in a process of
    its own (conf/gpu) or in this one (the sandbox)."""
    inputs = {
        "train_tasks": "train_tasks",
        "params": "params:training",
        "prompt": "params:conductor.prompt",
        "worker_pool_config": "worker_pool_config",
        "worker_credentials": "worker_credentials",
        "own_process": "params:stages.training.own_process",
    }
    if start_from:
        inputs["start_from"] = start_from
    return Pipeline(
        [
            Node(
                train_conductor_node,
                inputs,
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
