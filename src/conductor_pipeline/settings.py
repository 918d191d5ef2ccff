"""Kedro project settings: https://docs.kedro.org/en/stable/kedro_project_setup/settings.html"""

from kedro.config import OmegaConfigLoader

from conductor_pipeline.hooks import ProjectHooks
from conductor_pipeline.paths import project_root


def _project_root_resolver(*_: str) -> str:
    # OmegaConf resolvers are called with the (empty) argument list of ``${project_root:}``
    return project_root().as_posix()


HOOKS = (ProjectHooks(),)

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
