"""Kedro project settings: https://docs.kedro.org/en/stable/kedro_project_setup/settings.html"""

from conductor_pipeline.offline import apply_offline_defaults

apply_offline_defaults()  # `kedro run` / `kedro jupyter` without the Makefile stay offline too

import logging  # noqa: E402
import warnings  # noqa: E402

from conductor_pipeline.log_filters import KnownNoise  # noqa: E402

# Loggers whose records bypass the console handler's filter (conf/base/logging.yml) or that
# speak before it when `kedro run` is called without the Makefile: captured warnings, asyncio,
# and libraries with their own handlers (MLflow, transformers). log_filters.py says why
# each message is dropped.
_NOISY_LOGGERS = (
    "py.warnings",
    "asyncio",
    "mlflow.pyfunc",
    "transformers.trainer_utils",
    "transformers.tokenization_utils_tokenizers",
)


def quiet_known_noise() -> None:
    """Drop the known noise of log_filters.py from those loggers (idempotent), and the
    OmegaConf deprecation notice (raised by Kedro's own calls) at the warnings level."""
    warnings.filterwarnings(
        "ignore", message=r"register_new_resolver\(\) is deprecated", category=UserWarning
    )
    for name in _NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, KnownNoise) for f in logger.filters):
            logger.addFilter(KnownNoise())


quiet_known_noise()

from typing import Any  # noqa: E402

from kedro.config import OmegaConfigLoader  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from conductor_pipeline.distributed import is_main_process  # noqa: E402
from conductor_pipeline.hooks import MlflowRunHooks, ProjectHooks  # noqa: E402
from conductor_pipeline.paths import project_root  # noqa: E402
from conductor_pipeline.run_summary import RunSummaryHooks  # noqa: E402
from conductor_pipeline.setup_errors import SetupErrorHooks  # noqa: E402


def _project_root_resolver(*_: str) -> str:
    # OmegaConf resolvers are called with the (empty) argument list of ``${project_root:}``
    return project_root().as_posix()


HOOKS = (ProjectHooks(), MlflowRunHooks(), RunSummaryHooks(), SetupErrorHooks())

# Several processes (`accelerate launch --num_processes N -m kedro run`): only the main one
# opens the kedro-mlflow run; the others log nothing (one run per `kedro run`, not N).
if not is_main_process():
    DISABLE_HOOKS_FOR_PLUGINS = ("kedro_mlflow",)

# Parameter mappings keyed by dataset or domain names: under a soft merge an environment's
# sources would be added to the sandbox's (conf/gpu would load the reasoning-gym tasks too).
REPLACED_PARAMETERS: tuple[tuple[str, ...], ...] = (
    ("data_prep", "sources"),
    ("data_prep", "domain_quota"),
)

# The worker pool's section that only one kind reads: an environment that sets its own
# ``worker_pool.kind`` drops the other kind's (gpu's configured pool keeps no sandbox section,
# a local sandbox pool no configured worker list). Lists are replaced whole by a soft merge.
POOL_KIND_SECTIONS = {"sandbox": "sandbox", "configured": "workers"}


class ProfileConfigLoader(OmegaConfigLoader):
    """Kedro's loader with the parameters and the worker pool of an environment soft-merged
    over conf/base (``merge_strategy`` below): conf/gpu holds only the leaves that differ. At
    the paths of ``REPLACED_PARAMETERS`` an environment that sets the mapping replaces it
    whole; a pool keeps only its own kind's section (``POOL_KIND_SECTIONS``)."""

    def _merge_configs(
        self, config: dict[str, Any], env_config: dict[str, Any], key: str, env_path: str
    ) -> Any:
        merged = super()._merge_configs(config, env_config, key, env_path)
        if isinstance(env_config, DictConfig):
            env_config = OmegaConf.to_container(env_config)
        if key == "workers":
            return _own_kind_sections(merged)
        if key != "parameters":
            return merged
        for path in REPLACED_PARAMETERS:
            value: Any = env_config
            for part in path:
                value = value.get(part) if isinstance(value, dict) else None
            if value is not None:
                parent = merged
                for part in path[:-1]:
                    parent = parent[part]
                parent[path[-1]] = value
        return merged


def _own_kind_sections(workers: dict[str, Any]) -> dict[str, Any]:
    """The merged ``workers`` config without the pool section of a kind it is not."""
    pool = workers.get("worker_pool")
    if isinstance(pool, dict):
        for kind, section in POOL_KIND_SECTIONS.items():
            if pool.get("kind") != kind:
                pool.pop(section, None)
    return workers


CONFIG_LOADER_CLASS = ProfileConfigLoader
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    "merge_strategy": {"parameters": "soft", "workers": "soft"},
    "custom_resolvers": {"project_root": _project_root_resolver},
    "config_patterns": {
        "mlflow": ["mlflow*", "mlflow*/**"],
        "workers": ["workers*", "workers*/**"],
    },
}
