"""The Kedro wiring: the training nodes with a fake pool, MLflow registration, config files."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conductor_pipeline.pipelines.training import create_pipeline
from conductor_pipeline.pipelines.training import nodes as training_nodes

from .fakes import FakePool, make_task

ROOT = Path(__file__).resolve().parents[2]


def test_pipeline_shape_and_catalog_entries():
    pipeline = create_pipeline()
    assert {n.name for n in pipeline.nodes} == {"train_conductor", "register_conductor"}
    params = [i for n in pipeline.nodes for i in n.inputs if i.startswith("params:")]
    # the training parameters, the Conductor prompt shared with evaluation and serving, and
    # whether training runs in a process of its own
    assert params == [
        "params:training",
        "params:conductor.prompt",
        "params:stages.training.own_process",
    ]
    catalog = yaml.safe_load((ROOT / "conf" / "base" / "catalog_training.yml").read_text())
    assert set(pipeline.all_outputs()) <= set(catalog)
    # worker configuration arrives as datasets (project hook), never as params
    assert {"worker_pool_config", "worker_credentials"} <= pipeline.inputs()


def test_registry_has_training_in_default():
    from conductor_pipeline.pipeline_registry import register_pipelines

    pipelines = register_pipelines()
    names = {n.name for n in pipelines["__default__"].nodes}
    assert {"train_conductor", "register_conductor"} <= names
    assert "training" in pipelines


@pytest.mark.slow
def test_train_and_register_a_conductor_version(tiny_model_dir, tmp_path, monkeypatch):
    import mlflow

    tasks = [make_task(i) for i in range(4)]
    pool = FakePool(tasks)

    @contextlib.contextmanager
    def fake_open_worker_pool(config, credentials=None, *, root):
        assert config == {"kind": "sandbox"} and credentials == {}
        yield _PoolAdapter(pool)

    monkeypatch.setattr(training_nodes, "open_worker_pool", fake_open_worker_pool)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_experiment("test-training")
    params = {
        "base_model": str(tiny_model_dir),
        "output_dir": str(tmp_path / "models"),
        "grpo": {
            "num_generations": 2,
            "prompts_per_step": 2,
            "max_steps": 1,
            "max_completion_length": 8,
        },
        "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "sft": {"enabled": True, "n_examples": 4, "max_steps": 1, "batch_size": 2},
        "curriculum": {"reference_worker": "sim-bad"},  # wrong on every question
    }
    frame = pd.DataFrame([t.to_record() for t in tasks])
    with mlflow.start_run() as run:
        info, history, sft_history = training_nodes.train_conductor_node(
            frame, params, {"few_shot": []}, {"kind": "sandbox"}, {}
        )
        version = training_nodes.register_conductor(info)
    assert info["global_step"] == 1 and info["sft"]["steps"] == 1
    assert list(history["step"]) == [1.0]
    # the SFT loss curve: one row per step in the output, and step-indexed in MLflow
    assert list(sft_history.columns) == list(training_nodes.SFT_HISTORY_COLUMNS)
    assert list(sft_history["step"]) == [1.0] and sft_history["loss"].notna().all()
    client = mlflow.MlflowClient()
    loss_steps = client.get_metric_history(run.info.run_id, "sft/loss")
    assert [(m.step, m.value) for m in loss_steps] == [(1, sft_history["loss"].iloc[0])]
    metrics = client.get_run(run.info.run_id).data.metrics
    assert "grpo/reward/mean" in metrics and "grpo/rollouts/parse_rate" in metrics
    # the curriculum's pre-pass, counted
    assert metrics["training/curriculum_wrong"] == 4.0
    assert metrics["training/curriculum_right"] == metrics["training/curriculum_unscored"] == 0.0
    assert metrics["grpo/curriculum/unsolved_share"] == 1.0
    assert version["version"] == "1" and version["name"] == "conductor"
    tags = client.get_model_version("conductor", "1").tags
    for key in ("base_model", "pool_fingerprint", "data_version", "config_fingerprint"):
        assert tags[key] == str(info[key])
    model = mlflow.pyfunc.load_model("models:/conductor/1")
    adapter_dir = model.unwrap_python_model().adapter_dir
    assert (adapter_dir / "adapter_config.json").is_file()
    out = model.predict(pd.DataFrame({"question": ["What is 1 + 1?"]}), params={"max_tokens": 4})
    assert len(out) == 1 and isinstance(out[0], str)
    # in the precision a served or evaluated Conductor computes in on this machine
    from conductor_pipeline.workers.local_model import model_dtype

    auto = str(model_dtype("auto")).removeprefix("torch.")
    assert model.unwrap_python_model().policy.loaded_dtype == auto


class _PoolAdapter:
    """Looks like a WorkerPool to ``PoolInfo.from_pool``: names, descriptions, specs, call."""

    def __init__(self, pool: FakePool) -> None:
        self._pool = pool
        self.names = pool.names
        self.descriptions = pool.descriptions
        self.specs = [_Spec(p) for p in pool.prices]

    async def __call__(self, worker, messages, sample_index=0):
        return await self._pool(worker, messages, sample_index)


class _Spec:
    def __init__(self, price: tuple[float, float]) -> None:
        self.input_cost_per_token, self.output_cost_per_token = price
        self.has_prices = True
