"""Project hooks: make sure the tracking store's directory exists before kedro-mlflow opens it,
hand the worker pool's configuration to the nodes that start a pool, and keep the outputs of
the processes other than the main one in memory (``accelerate launch``)."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

from kedro.framework.hooks import hook_impl
from kedro.pipeline import Pipeline

from conductor_pipeline.distributed import is_main_process, num_processes
from conductor_pipeline.paths import project_root
from conductor_pipeline.project import profile_globals
from conductor_pipeline.registry import use_registered_model

logger = logging.getLogger(__name__)


# stages that must run in one process: each would start its own vLLM on one port, pay every
# worker call again and race the other processes on registry aliases
SINGLE_PROCESS_PIPELINES = ("evaluation", "promotion", "reporting")


def refuse_single_process_stages(pipeline: Pipeline, processes: int) -> None:
    """Raise when ``pipeline`` holds a node of a single-process stage and ``processes`` > 1."""
    if processes <= 1:
        return
    from conductor_pipeline.pipeline_registry import register_pipelines

    registered = register_pipelines()
    names = {node.name for node in pipeline.nodes}
    stages = [
        stage
        for stage in SINGLE_PROCESS_PIPELINES
        if names & {node.name for node in registered[stage].nodes}
    ]
    if stages:
        raise RuntimeError(
            f"this run was launched as {processes} processes (WORLD_SIZE), but "
            f"{', '.join(stages)} must run in one: launch only training on several "
            "(`accelerate launch ... -m kedro run --env gpu --pipelines training`), then run "
            f"`kedro run --env gpu --pipelines <stage>` in one process for {', '.join(stages)}"
        )


def preflight_or_exit(pipeline: Pipeline, catalog: Any) -> None:
    """The preflight checks (``conductor_pipeline.preflight``, ``preflight.enabled``) for
    what ``pipeline`` will use. Problems end the run before its first node, one message
    for each, and the MLflow run kedro-mlflow has just opened is marked failed."""
    from conductor_pipeline.preflight import PreflightFailed, check_before_run

    def read(name: str) -> Any:
        return catalog.load(name) if name in catalog else None

    try:
        check_before_run(pipeline.all_inputs(), read)
    except PreflightFailed as failed:
        import mlflow

        if is_main_process() and mlflow.active_run() is not None:
            mlflow.end_run(status="FAILED")
        raise SystemExit(f"\nCannot run: {failed}") from None


class ProjectHooks:
    def __init__(self) -> None:
        self._config_loader = None

    # tryfirst: plugin hooks (kedro-mlflow) are registered later and would run first otherwise
    @hook_impl(tryfirst=True)
    def after_context_created(self, context) -> None:
        (project_root() / "mlruns").mkdir(parents=True, exist_ok=True)
        self._config_loader = context.config_loader
        use_registered_model(profile_globals(context.config_loader).get("registered_model"))

    @hook_impl
    def before_pipeline_run(self, run_params, pipeline, catalog) -> None:
        """Several processes (``accelerate launch -m kedro run``): only training spreads over
        them, so a run that also evaluates, promotes or reports is refused before its first
        node. Only the main process writes the pipeline's outputs; in the others they stay
        in memory (the nodes return the main process's results), so no file or MLflow
        artifact is written twice. With ``preflight.enabled`` (conf/gpu) the workers, keys
        and datasets the run needs are checked first (:func:`preflight_or_exit`)."""
        refuse_single_process_stages(pipeline, num_processes())
        preflight_or_exit(pipeline, catalog)
        if is_main_process():
            return
        from kedro.io import MemoryDataset

        for name in sorted(pipeline.all_outputs()):
            catalog[name] = MemoryDataset()

    # trylast: kedro-mlflow's on_pipeline_error (which closes the MLflow run as failed) first
    @hook_impl(trylast=True)
    def on_pipeline_error(self, error, run_params, pipeline, catalog) -> None:
        """A run a ``training.caps`` cap stopped ends with the cap's message (what was
        reached, where the checkpoint is, how to continue) instead of a traceback."""
        caps = sys.modules.get("conductor_pipeline.training.caps")
        if caps is None:
            return  # nothing imported it, so no cap stopped anything (and no torch import)
        seen: set[int] = set()
        while error is not None and id(error) not in seen:
            if isinstance(error, caps.TrainingStopped):
                raise SystemExit(f"\nStopped: {error}") from None
            seen.add(id(error))
            error = error.__cause__ or error.__context__

    @hook_impl
    def after_catalog_created(self, catalog) -> None:
        """``worker_pool_config`` (``conf/*/workers.yml``) and ``worker_credentials``
        (``credentials.yml``) as in-memory datasets. Not ``params:``, because kedro-mlflow
        logs every parameter and credentials must never reach MLflow."""
        loader = self._config_loader
        if loader is None:
            return
        from kedro.config import MissingConfigException

        try:
            workers = loader["workers"]
        except MissingConfigException:
            logger.debug("no workers.yml; worker_pool_config not provided")
            return
        try:
            credentials = dict(loader["credentials"])
        except MissingConfigException:
            credentials = {}
        if "worker_pool" in workers:
            catalog["worker_pool_config"] = dict(workers["worker_pool"])
            catalog["worker_credentials"] = credentials


class MlflowRunHooks:
    """Keep the project's MLflow store usable after a move, and name each ``kedro run``'s
    MLflow run after its pipeline, start time and registered version (kedro-mlflow alone
    names them all ``__default__``)."""

    def __init__(self) -> None:
        self._naming: tuple[list[str], datetime] | None = None

    # tryfirst: before kedro-mlflow's own after_context_created opens the experiment, whose
    # stored artifact location must already point into this checkout
    @hook_impl(tryfirst=True)
    def after_context_created(self, context) -> None:
        from conductor_pipeline.registry import rebase_store

        rebase_store(project_root())

    # trylast: kedro-mlflow has started the run by then
    @hook_impl(trylast=True)
    def before_pipeline_run(self, run_params, pipeline, catalog) -> None:
        import mlflow

        from conductor_pipeline.registry import PROJECT_PATH_TAG, PROJECT_PATH_TAG_VALUE, run_name

        self._naming = None
        run = mlflow.active_run()
        if run is None:
            return
        # kedro-mlflow's tag names the project folder by absolute path: relative, for moves
        mlflow.set_tag(PROJECT_PATH_TAG, PROJECT_PATH_TAG_VALUE)
        names = run_params.get("pipeline_names") or run_params.get("pipeline_name")
        names = [names] if isinstance(names, str) else list(names or ["__default__"])
        if run.info.run_name != "+".join(names):
            return  # a name set in mlflow.yml (tracking.run.name) is kept as configured
        self._naming = (names, datetime.now(UTC))
        mlflow.set_tag("mlflow.runName", run_name(*self._naming))

    @hook_impl
    def after_node_run(self, node, catalog, inputs, outputs, is_async, run_id) -> None:
        """Once a node has registered a ``conductor`` version, the run's name says which."""
        if self._naming is None:
            return
        import mlflow

        from conductor_pipeline.registry import registered_model, run_name

        for value in (outputs or {}).values():
            if isinstance(value, dict) and value.get("name") == registered_model():
                if value.get("version") and mlflow.active_run() is not None:
                    name = run_name(*self._naming, version=str(value["version"]))
                    mlflow.set_tag("mlflow.runName", name)
                return
