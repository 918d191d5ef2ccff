"""training nodes: thin wrappers around ``conductor_pipeline.training``.

Only ``train_conductor`` takes parameters (``params:training``, ``params:conductor.prompt``,
the prompt shared with evaluation and serving, and ``params:stages.training.own_process``),
so kedro-mlflow logs them once; worker configurations never pass through ``params:``.

With ``stages.training.own_process`` (true in conf/gpu) the training work runs in a fresh child
process that exits before the node returns (:mod:`conductor_pipeline.stage_process`), so
the model, its optimizer state and a colocated vLLM engine have left the GPU before
evaluation launches its own vLLM server.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd

from conductor_pipeline.distributed import broadcast_from_main, is_main_process, num_processes
from conductor_pipeline.paths import project_root
from conductor_pipeline.registry import (
    local_adapter,
    portable_adapter,
    registered_model,
    set_version_description,
)
from conductor_pipeline.setup_errors import check_gpu, missing_key_error
from conductor_pipeline.stage_process import run_in_own_process
from conductor_pipeline.tasks import Task
from conductor_pipeline.tasks.frames import tasks_from_frame
from conductor_pipeline.training.configs import TrainingConfig
from conductor_pipeline.training.inputs import PoolInfo
from conductor_pipeline.workers.config import WorkerConfigError
from conductor_pipeline.workers.runtime import open_worker_pool
from conductor_pipeline.workflow.adapter_base import check_adapter_base

logger = logging.getLogger(__name__)

# columns of the ``sft_history`` output (data/08_reporting/sft_history.csv)
SFT_HISTORY_COLUMNS = ("step", "loss", "grad_norm", "learning_rate")
# What the registered pyfunc model needs at load time (torch/transformers pinned as in
# pyproject; without explicit requirements MLflow tries to infer them and fails).
PIP_REQUIREMENTS = ["torch==2.13.0", "transformers==5.17.0", "peft==0.21.2", "conductor-pipeline"]


def log_metrics_to_mlflow(metrics: dict[str, float], step: int) -> None:
    """``mlflow.log_metrics`` into the active (kedro-mlflow) run; a no-op without one and
    in the processes other than the main one (``accelerate launch``)."""
    if not is_main_process() or mlflow.active_run() is None:
        return
    clean = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
    if clean:
        mlflow.log_metrics(clean, step=int(step))


def _metrics_logger(run: tuple[str, str] | None) -> Callable[[dict[str, float], int], None]:
    """Logs into the MLflow run ``(tracking URI, run id)`` from a process that did not
    start it (the training stage's own process); a no-op without a run."""
    if run is None:
        return lambda metrics, step: None
    from mlflow.entities import Metric

    client = mlflow.MlflowClient(run[0])

    def log(metrics: dict[str, float], step: int) -> None:
        clean = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
        if clean:
            now = int(time.time() * 1000)
            batch = [Metric(k, v, now, int(step)) for k, v in clean.items()]
            client.log_batch(run[1], metrics=batch)

    return log


def resolve_start_adapter(start_from: str | None, base_model: str) -> str | None:
    """The adapter folder ``start_from`` names (a path or a registry reference), or None to
    train from ``base_model`` when it does not resolve yet (no champion so far)."""
    adapter = local_adapter(start_from, required=False)
    if start_from and adapter is None:
        logger.warning("%s does not resolve yet: training from the base model", start_from)
    elif adapter is not None and not Path(adapter).is_dir():
        raise FileNotFoundError(f"start_from: adapter folder {adapter} does not exist")
    elif adapter is not None:
        # before the worker pool starts: minutes later would be a costly place to learn it
        check_adapter_base(
            adapter, base_model, where="training start_from", label=start_from, root=project_root()
        )
        logger.info("training continues from %s (%s)", start_from, adapter)
    return adapter


def train_conductor_node(
    train_tasks: pd.DataFrame,
    params: dict[str, Any],
    prompt: dict[str, Any] | None,
    worker_pool_config: dict[str, Any],
    worker_credentials: dict[str, Any],
    start_from: str | None = None,
    own_process: bool = False,
) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]:
    """SFT warm start (optional) + GRPO (+ recursion stage) on the train split.

    ``start_from`` (retraining): a registry reference such as ``models:/conductor@champion``
    or a LoRA folder to continue from instead of the warm start; a reference that does not
    resolve yet (no champion in a fresh project) trains from the base model.

    ``own_process`` (``params:stages.training.own_process``): train in a fresh child process
    that has exited when this returns. Ignored when launched as several processes
    (``accelerate launch``), which run training only.

    Returns the adapter info (where the adapter is, fingerprints, timings), the per-step
    GRPO metrics history and the per-step SFT history (``SFT_HISTORY_COLUMNS``; no rows
    without a warm start); per-step metrics also go live to the MLflow run (``grpo/…``,
    ``sft/loss``).
    """
    config = TrainingConfig.from_params(params)
    tasks = tasks_from_frame(train_tasks)
    start_adapter = resolve_start_adapter(start_from, config.base_model)
    # a missing GPU or key: one message naming the fix, before any model is loaded
    check_gpu(["training.grpo.use_vllm"] if config.grpo.use_vllm else [])
    work = (tasks, config, prompt, worker_pool_config, worker_credentials, start_adapter)
    if own_process and num_processes() == 1:
        info, history, sft_rows = run_in_own_process(
            "training", _train_in_own_process, *work, _active_run()
        )
    else:
        info, history, sft_rows = _train(*work, log_metrics_to_mlflow)
    sft_history = pd.DataFrame(sft_rows, columns=list(SFT_HISTORY_COLUMNS))
    return info, pd.DataFrame(history), sft_history


def _active_run() -> tuple[str, str] | None:
    run = mlflow.active_run()
    return None if run is None else (mlflow.get_tracking_uri(), run.info.run_id)


def _train_in_own_process(
    tasks: list[Task],
    config: TrainingConfig,
    prompt: dict[str, Any] | None,
    worker_pool_config: dict[str, Any],
    worker_credentials: dict[str, Any],
    start_adapter: str | None,
    run: tuple[str, str] | None,
) -> tuple[dict[str, Any], list[dict[str, Any]], list[Any]]:
    """:func:`_train` in the training stage's own process, logging into the parent's run."""
    return _train(
        tasks,
        config,
        prompt,
        worker_pool_config,
        worker_credentials,
        start_adapter,
        _metrics_logger(run),
    )


def _train(
    tasks: list[Task],
    config: TrainingConfig,
    prompt: dict[str, Any] | None,
    worker_pool_config: dict[str, Any],
    worker_credentials: dict[str, Any],
    start_adapter: str | None,
    log_metrics: Callable[[dict[str, float], int], None],
) -> tuple[dict[str, Any], list[dict[str, Any]], list[Any]]:
    """The training work: adapter info, GRPO history rows, SFT history rows."""
    # imported here, not at the top: it pulls in torch, transformers, peft and TRL (7 s),
    # which every `kedro run` would pay while it registers the pipelines
    from conductor_pipeline.training.grpo import train_conductor

    try:
        # the configured pool; the sandbox server is started when the pool is the sandbox
        with open_worker_pool(worker_pool_config, worker_credentials, root=project_root()) as pool:
            result = train_conductor(
                tasks,
                PoolInfo.from_pool(pool),
                config,
                prompt=prompt,
                start_adapter=start_adapter,
                log_metrics=log_metrics,
            )
    except WorkerConfigError as err:
        missing = missing_key_error(err)
        if missing is None:
            raise
        raise missing from err
    log_metrics(
        {f"training/seconds_{k}": v for k, v in result.seconds.items()}
        | {"training/prompts": float(result.dataset["n_prompts"])}
        | {
            f"training/{key}": float(value)
            for key, value in result.dataset.items()
            if key.startswith("curriculum_") and isinstance(value, int)
        },
        result.global_step,
    )
    logger.info(
        "trained %d GRPO steps in %.0f s; adapter at %s",
        result.global_step,
        result.seconds.get("total", 0.0),
        result.adapter_dir,
    )
    return result.to_dict(), list(result.history), list(result.sft_history)


def register_conductor(adapter_info: dict[str, Any]) -> dict[str, Any]:
    """Log the adapter as an ``mlflow.pyfunc`` model and register a new ``conductor`` version.

    Version tags: base model, pool fingerprint (worker names and prices), data version
    (hash of the train split), config fingerprint, run fingerprint.

    Several processes (``accelerate launch``): the main process registers one version, the
    others wait and return its record.
    """
    if not is_main_process():
        return broadcast_from_main(None)
    return broadcast_from_main(_register(adapter_info))


def _register(adapter_info: dict[str, Any]) -> dict[str, Any]:
    from mlflow.models import infer_signature

    from conductor_pipeline.pipelines.training.mlflow_model import ADAPTER_ARTIFACT, ConductorModel

    adapter_dir = Path(adapter_info["adapter_dir"])
    if not adapter_dir.is_dir():
        raise FileNotFoundError(f"trained adapter folder {adapter_dir} is missing")
    # base_model_name_or_path relative to the project, so the registered copy survives a move
    portable_adapter(adapter_dir)
    tags = {
        "base_model": str(adapter_info["base_model"]),
        "pool_fingerprint": str(adapter_info["pool_fingerprint"]),
        "data_version": str(adapter_info["data_version"]),
        "config_fingerprint": str(adapter_info["config_fingerprint"]),
        "run_fingerprint": str(adapter_info["run_fingerprint"]),
        "global_step": str(adapter_info["global_step"]),
        "workers": ",".join(adapter_info.get("worker_names", [])),
    }
    name = registered_model()  # the profile's own (conf/<env>/globals.yml)
    own_run = mlflow.active_run() is None
    run = mlflow.start_run() if own_run else mlflow.active_run()
    try:
        mlflow.set_tags({f"conductor.{k}": v for k, v in tags.items()})
        signature = infer_signature(
            pd.DataFrame({"question": ["What is 2 + 2?"]}),
            ["model_id = [0]\nsubtasks = ['...']\naccess_list = [[]]"],
            params={"temperature": 0.0, "max_tokens": 512, "seed": 0},
        )
        model_info = mlflow.pyfunc.log_model(
            name="conductor",
            python_model=ConductorModel(),
            artifacts={ADAPTER_ARTIFACT: str(adapter_dir)},
            model_config={
                "max_completion_length": int(adapter_info.get("max_completion_length", 512))
            },
            signature=signature,
            pip_requirements=PIP_REQUIREMENTS,
            registered_model_name=name,
        )
        version = str(model_info.registered_model_version)
        client = mlflow.MlflowClient()
        for key, value in tags.items():
            client.set_model_version_tag(name, version, key, value)
        set_version_description(version, adapter_info)
        run_id = run.info.run_id
    finally:
        if own_run:
            mlflow.end_run()
    return {
        "name": name,
        "version": version,
        "model_uri": f"models:/{name}/{version}",
        "artifact_uri": model_info.model_uri,
        "run_id": run_id,
        "tags": tags,
    }
