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

from kedro.config import OmegaConfigLoader  # noqa: E402

from conductor_pipeline.distributed import is_main_process  # noqa: E402
from conductor_pipeline.hooks import MlflowRunHooks, ProjectHooks  # noqa: E402
from conductor_pipeline.paths import project_root  # noqa: E402
from conductor_pipeline.pipelines.data_prep.preflight import SetupErrorHooks  # noqa: E402
from conductor_pipeline.run_summary import RunSummaryHooks  # noqa: E402


def _project_root_resolver(*_: str) -> str:
    # OmegaConf resolvers are called with the (empty) argument list of ``${project_root:}``
    return project_root().as_posix()


HOOKS = (ProjectHooks(), MlflowRunHooks(), RunSummaryHooks(), SetupErrorHooks())

# Several processes (`accelerate launch --num_processes N -m kedro run`): only the main one
# opens the kedro-mlflow run; the others log nothing (one run per `kedro run`, not N).
if not is_main_process():
    DISABLE_HOOKS_FOR_PLUGINS = ("kedro_mlflow",)

CONFIG_LOADER_CLASS = OmegaConfigLoader
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    "custom_resolvers": {"project_root": _project_root_resolver},
    "config_patterns": {
        "mlflow": ["mlflow*", "mlflow*/**"],
        "workers": ["workers*", "workers*/**"],
    },
}
