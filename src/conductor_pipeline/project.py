"""The project's configuration outside a Kedro session (CLI, servers, notebooks).

Reads ``conf/`` with the same loader settings as ``kedro run``, so ``conductor ask --env gpu``
sees exactly what ``kedro run --env gpu`` sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conductor_pipeline.paths import project_root
from conductor_pipeline.registry import DEFAULT_REGISTERED_MODEL

# where a profile keeps what it writes, and the registered model it trains into, unless its
# conf/<env>/globals.yml says otherwise (the sandbox's values)
DEFAULT_DATA_ROOT = "data"


def profile_globals(loader: Any) -> dict[str, Any]:
    """The ``globals.yml`` of a Kedro config loader (base, overlaid by the run environment's),
    with the project's defaults for ``data_root`` and ``registered_model``."""
    from kedro.config import MissingConfigException

    try:
        values = dict(loader["globals"] or {})
    except MissingConfigException:
        values = {}
    values.setdefault("data_root", DEFAULT_DATA_ROOT)
    values.setdefault("registered_model", DEFAULT_REGISTERED_MODEL)
    return values


@dataclass
class ProjectConfig:
    root: Path
    env: str
    parameters: dict[str, Any]
    worker_pool: dict[str, Any]
    credentials: dict[str, Any]
    # the profile's data tree (``data``, ``data/gpu``), relative to ``root``
    data_root: str = DEFAULT_DATA_ROOT
    # the profile's registered model (``conductor``, ``conductor-qwen``)
    registered_model: str = DEFAULT_REGISTERED_MODEL

    @property
    def data_dir(self) -> Path:
        """The profile's data tree as an absolute path."""
        return self.root / self.data_root

    def __repr__(self) -> str:  # credentials stay out of reprs and logs
        return f"ProjectConfig(root={self.root!s}, env={self.env!r}, parameters={sorted(self.parameters)})"


def load_project_config(env: str | None = None, root: Path | None = None) -> ProjectConfig:
    from kedro.config import MissingConfigException

    from conductor_pipeline.settings import CONFIG_LOADER_ARGS, CONFIG_LOADER_CLASS

    root = root or project_root()
    args = dict(CONFIG_LOADER_ARGS)
    env = env or args["default_run_env"]
    loader = CONFIG_LOADER_CLASS(conf_source=str(root / "conf"), env=env, **args)
    try:
        credentials = dict(loader["credentials"])
    except MissingConfigException:
        credentials = {}
    try:
        workers = dict(loader["workers"])
    except MissingConfigException as err:
        raise FileNotFoundError(f"no workers.yml in {root / 'conf'} for env {env!r}") from err
    if "worker_pool" not in workers:
        raise ValueError("workers.yml: the top-level key must be 'worker_pool'")
    profile = profile_globals(loader)
    return ProjectConfig(
        root,
        env,
        dict(loader["parameters"]),
        dict(workers["worker_pool"]),
        credentials,
        data_root=str(profile["data_root"]),
        registered_model=str(profile["registered_model"]),
    )
