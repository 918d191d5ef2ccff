"""Kedro project settings: https://docs.kedro.org/en/stable/kedro_project_setup/settings.html"""

from conductor_pipeline.offline import apply_offline_defaults

apply_offline_defaults()  # `kedro run` / `kedro jupyter` without the Makefile stay offline too

from kedro.config import OmegaConfigLoader  # noqa: E402

from conductor_pipeline.distributed import is_main_process  # noqa: E402
from conductor_pipeline.hooks import MlflowRunHooks, ProjectHooks  # noqa: E402
from conductor_pipeline.paths import project_root  # noqa: E402


def _project_root_resolver(*_: str) -> str:
    # OmegaConf resolvers are called with the (empty) argument list of ``${project_root:}``
    return project_root().as_posix()


HOOKS = (ProjectHooks(), MlflowRunHooks())

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
