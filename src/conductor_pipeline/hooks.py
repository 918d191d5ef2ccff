"""Project hooks: make sure the tracking store's directory exists before kedro-mlflow opens it,
hand the worker pool's configuration to the nodes that start a pool, and keep the outputs of
the processes other than the main one in memory (``accelerate launch``)."""

from __future__ import annotations

import logging

from kedro.framework.hooks import hook_impl

from conductor_pipeline.distributed import is_main_process
from conductor_pipeline.paths import project_root

logger = logging.getLogger(__name__)


class ProjectHooks:
    def __init__(self) -> None:
        self._config_loader = None

    # tryfirst: plugin hooks (kedro-mlflow) are registered later and would run first otherwise
    @hook_impl(tryfirst=True)
    def after_context_created(self, context) -> None:
        (project_root() / "mlruns").mkdir(parents=True, exist_ok=True)
        self._config_loader = context.config_loader

    @hook_impl
    def before_pipeline_run(self, run_params, pipeline, catalog) -> None:
        """Several processes (``accelerate launch -m kedro run``): only the main process
        writes the pipeline's outputs; in the others they stay in memory (the nodes return
        the main process's results), so no file or MLflow artifact is written twice."""
        if is_main_process():
            return
        from kedro.io import MemoryDataset

        for name in sorted(pipeline.all_outputs()):
            catalog[name] = MemoryDataset()

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
