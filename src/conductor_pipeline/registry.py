"""The MLflow model registry of Conductor adapters: resolve ``models:/conductor@champion`` to a
local LoRA folder. Registration happens in training; promotion moves the aliases."""

from __future__ import annotations

import logging
from pathlib import Path

from conductor_pipeline.paths import mlflow_tracking_uri, project_root

logger = logging.getLogger(__name__)

REGISTERED_MODEL = "conductor"


class AdapterNotFoundError(LookupError):
    """The registry reference does not resolve to a LoRA adapter."""


def _use_project_store() -> None:
    # an explicit MLFLOW_TRACKING_URI (e.g. a team server) wins over the project's SQLite store
    import os

    import mlflow

    if not os.environ.get("MLFLOW_TRACKING_URI"):
        mlflow.set_tracking_uri(mlflow_tracking_uri(project_root()))


def _find_adapter(folder: Path) -> Path | None:
    configs = sorted(folder.rglob("adapter_config.json"), key=lambda p: len(p.parts))
    return configs[0].parent if configs else None


def resolve_adapter(reference: str, *, required: bool = True) -> str | None:
    """Download (once, into MLflow's cache) the model behind ``reference`` and return the
    folder holding its ``adapter_config.json``.

    With ``required=False`` a reference that does not resolve (no such model, alias or
    version yet) returns ``None`` and logs why, so a fresh project can still ask the base
    policy; with ``required=True`` it raises :class:`AdapterNotFoundError`.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    _use_project_store()
    try:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=reference))
    except (MlflowException, OSError) as err:
        if required:
            raise AdapterNotFoundError(f"{reference} does not resolve: {err}") from err
        logger.warning(
            "%s does not resolve (%s); using the base policy without an adapter",
            reference,
            str(err).splitlines()[0],
        )
        return None
    adapter = _find_adapter(local)
    if adapter is None:
        message = f"{reference} holds no LoRA adapter (no adapter_config.json under {local})"
        if required:
            raise AdapterNotFoundError(message)
        logger.warning(message)
        return None
    return str(adapter)


def local_adapter(reference: str | None, *, required: bool = True) -> str | None:
    """The local LoRA folder for ``reference``: a registry reference
    (``models:/conductor@champion``, resolved with :func:`resolve_adapter`) or a folder path,
    returned as given. ``None`` or empty gives ``None`` (no adapter)."""
    if not reference:
        return None
    if str(reference).startswith("models:/"):
        return resolve_adapter(str(reference), required=required)
    return str(reference)
