"""Which Conductor is served: a registry version, a local adapter folder, or the base policy.

``conductor serve --model`` accepts ``conductor@champion`` (an alias), ``conductor/3`` (a
version) or the full ``models:/conductor@champion``; ``--adapter PATH`` takes a LoRA folder.
A reference given explicitly (``--model`` or ``serving.model``) must resolve, or start-up
fails saying so; the default (``conductor.policy.adapter``, ``models:/conductor@champion``)
falls back to the base policy while nothing is registered, reported as version ``base``.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PUBLIC_NAME = "conductor"
_REFERENCE = re.compile(r"^(?:models:/)?(?P<name>[A-Za-z0-9_.\-]+)(?P<sep>[@/])(?P<tag>[^/@\s]+)$")


class ModelResolutionError(ValueError):
    """A requested model reference does not name a usable Conductor."""


@dataclass(frozen=True)
class ServedModel:
    """What the API serves. ``version`` is the registry version number, ``"base"`` (no
    adapter) or ``"adapter"`` (a folder given with ``--adapter``)."""

    version: str = "base"
    registered_name: str | None = None
    alias: str | None = None
    reference: str | None = None
    adapter_dir: str | None = None
    policy: str | None = None

    @property
    def id(self) -> str:
        """The versioned model id, e.g. ``conductor/3`` or ``conductor/base``."""
        return f"{PUBLIC_NAME}/{self.version}"

    def model_ids(self) -> list[str]:
        """Every ``model`` value a request may use for this Conductor."""
        ids = [PUBLIC_NAME, self.id]
        if self.alias:
            ids.append(f"{PUBLIC_NAME}@{self.alias}")
        return ids

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "version": self.version,
            "registered_model": self.registered_name,
            "alias": self.alias,
            "source": self.reference,
            "policy": self.policy,
        }


def registry_uri(reference: str) -> str:
    """``conductor@champion`` / ``conductor/3`` / ``models:/...`` as a ``models:/`` URI."""
    match = _REFERENCE.match(reference.strip())
    if not match:
        raise ModelResolutionError(
            f"{reference!r} is not a model reference; use NAME@ALIAS (conductor@champion), "
            "NAME/VERSION (conductor/3) or models:/NAME@ALIAS"
        )
    return f"models:/{match['name']}{match['sep']}{match['tag']}"


def _split(uri: str) -> tuple[str, str, str]:
    match = _REFERENCE.match(uri)
    assert match is not None
    return match["name"], match["sep"], match["tag"]


def _version_of(name: str, sep: str, tag: str) -> str:
    """The registry version number behind an alias (or the version itself)."""
    if sep == "/":
        return tag
    from mlflow import MlflowClient

    return str(MlflowClient().get_model_version_by_alias(name, tag).version)


def _use_project_store(root: Path | None) -> None:
    import mlflow

    from conductor_pipeline.paths import mlflow_tracking_uri

    if not os.environ.get("MLFLOW_TRACKING_URI"):
        mlflow.set_tracking_uri(mlflow_tracking_uri(root))


# the files PEFT reads a LoRA adapter's weights from
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


def resolve_served_model(
    reference: str | None,
    *,
    adapter_path: str | None = None,
    explicit: bool = False,
    root: Path | None = None,
) -> ServedModel:
    """Resolve what to serve; raises :class:`ModelResolutionError` for an explicit reference
    (or any ``--adapter``) that does not resolve."""
    if adapter_path:
        if adapter_path.startswith("models:/"):
            return resolve_served_model(adapter_path, explicit=True, root=root)
        folder = Path(adapter_path)
        if not (folder / "adapter_config.json").is_file():
            raise ModelResolutionError(
                f"--adapter {adapter_path}: no adapter_config.json there (expected a PEFT LoRA folder)"
            )
        if not any((folder / name).is_file() for name in ADAPTER_WEIGHTS):
            raise ModelResolutionError(
                f"--adapter {adapter_path}: adapter_config.json but no weights there "
                f"(expected {' or '.join(ADAPTER_WEIGHTS)})"
            )
        return ServedModel(version="adapter", reference=str(folder), adapter_dir=str(folder))
    if not reference:
        return ServedModel()
    looks_like_path = not _REFERENCE.match(reference.strip()) or Path(reference).exists()
    if not reference.startswith("models:/") and looks_like_path:
        # a folder (as `conductor ask --adapter` takes it)
        if explicit or Path(reference).is_dir():
            return resolve_served_model(None, adapter_path=reference, root=root)
        log.warning("adapter folder %s not found; serving the base policy", reference)
        return ServedModel()
    uri = registry_uri(reference)
    from conductor_pipeline.registry import AdapterNotFoundError, resolve_adapter

    _use_project_store(root)
    try:
        adapter = resolve_adapter(uri, required=explicit)
    except AdapterNotFoundError as err:
        raise ModelResolutionError(
            f"{reference}: {str(err).rstrip('.')}. Register a Conductor version and point the alias at it "
            "(the promotion pipeline does), or leave --model out to serve the base policy."
        ) from err
    if adapter is None:
        log.warning("%s is not registered yet; serving the base policy (version 'base')", uri)
        return ServedModel()
    name, sep, tag = _split(uri)
    try:
        version = _version_of(name, sep, tag)
    except Exception as err:  # resolved a moment ago; report, do not guess
        raise ModelResolutionError(f"{uri}: cannot read its version number: {err}") from err
    return ServedModel(
        version=version,
        registered_name=name,
        alias=tag if sep == "@" else None,
        reference=uri,
        adapter_dir=adapter,
    )
