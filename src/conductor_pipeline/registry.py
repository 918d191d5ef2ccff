"""The MLflow model registry of Conductor adapters: resolve ``models:/conductor@champion`` to a
local LoRA folder. Registration happens in training; promotion moves the aliases."""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from conductor_pipeline.paths import mlflow_tracking_uri, project_root, reroot

logger = logging.getLogger(__name__)

DEFAULT_REGISTERED_MODEL = "conductor"
# a registry name that also reads as a model reference (serving/models.py: NAME@ALIAS)
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_registered_model = DEFAULT_REGISTERED_MODEL


def registered_model() -> str:
    """The registered model this process trains into, evaluates, promotes and serves: the
    profile's ``registered_model`` (``conf/<env>/globals.yml``), set by the project hook of
    ``kedro run`` and by the CLI; ``conductor`` until then. Each profile keeps its own, so a
    sandbox adapter is never the GPU profile's champion."""
    return _registered_model


def use_registered_model(name: str | None) -> str:
    """Make ``name`` (``None``: the default) this process's registered model; returns it."""
    global _registered_model
    name = DEFAULT_REGISTERED_MODEL if name is None else str(name)
    if not _MODEL_NAME.match(name):
        raise ValueError(
            f"registered_model {name!r} (conf/<env>/globals.yml): use letters, digits, "
            "'.', '_' and '-' only"
        )
    _registered_model = name
    return name


class AdapterNotFoundError(LookupError):
    """The registry reference does not resolve to a LoRA adapter."""


def _use_project_store() -> None:
    # an explicit MLFLOW_TRACKING_URI (e.g. a team server) wins over the project's SQLite store
    import mlflow

    if not os.environ.get("MLFLOW_TRACKING_URI"):
        mlflow.set_tracking_uri(mlflow_tracking_uri(project_root()))
    rebase_store()


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


# -- portability ---------------------------------------------------------------------------------
# MLflow records artifact locations as absolute paths, and PEFT records the base model's path
# in adapter_config.json. A moved or cloned project would point back into the old checkout
# (or nowhere). The store is re-rooted under the current project before it is used, and
# adapters are registered with a base-model path relative to the project root.

# (table, column) pairs of the SQLite store that hold artifact locations
_LOCATION_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
)
_BASE_MODEL_KEY = "base_model_name_or_path"


def _project_store_path(root: Path) -> Path | None:
    """The project's SQLite file when the tracking URI in use is that store, else ``None``
    (a team server or another store is never rewritten)."""
    ours = mlflow_tracking_uri(root)
    current = os.environ.get("MLFLOW_TRACKING_URI") or ours
    if current.rstrip("/") != ours:
        return None
    return root / "mlruns" / "mlflow.db"


def rebase_store(root: Path | None = None) -> int:
    """Re-root the artifact locations in the project's SQLite store under ``root`` (default:
    the current project) when they point into another checkout's ``mlruns/``, and store the
    runs' ``project_path`` tags relative. After a move, also re-root the ``MLmodel`` files
    under ``mlruns/`` and make the base-model paths of the adapters under ``mlruns/`` and
    ``data/06_models/`` relative. Returns how many store values changed; 0 (and no write)
    when the store is already in place or absent."""
    root = (root or project_root()).resolve()
    database = _project_store_path(root)
    if database is None or not database.is_file():
        return 0
    changed = 0
    with sqlite3.connect(database, timeout=30) as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
        for table, column in _LOCATION_COLUMNS:
            if table not in tables:
                continue
            rows = conn.execute(
                f"SELECT rowid, {column} FROM {table} WHERE {column} LIKE '%/mlruns%'"
            ).fetchall()
            for rowid, value in rows:
                moved = reroot(str(value), root, "mlruns")
                if moved is not None:
                    conn.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (moved, rowid))
                    changed += 1
        if "trace_tags" in tables:  # where each trace keeps its artifacts
            rows = conn.execute(
                "SELECT rowid, value FROM trace_tags WHERE key = 'mlflow.artifactLocation'"
            ).fetchall()
            for rowid, value in rows:
                moved = reroot(str(value), root, "mlruns")
                if moved is not None:
                    conn.execute("UPDATE trace_tags SET value = ? WHERE rowid = ?", (moved, rowid))
                    changed += 1
        if "tags" in tables:  # kedro-mlflow's run tag; runs of older versions kept the path
            changed += conn.execute(
                f"UPDATE tags SET value = '{PROJECT_PATH_TAG_VALUE}' "
                f"WHERE key = '{PROJECT_PATH_TAG}' AND value LIKE '/%'"
            ).rowcount
    if changed:
        models = _reroot_mlmodel_files(root / "mlruns", root)
        adapters = portable_adapter(root / "mlruns", root)
        adapters += portable_adapter(root / "data" / "06_models", root)
        logger.info(
            "the project moved to %s: re-rooted %d MLflow store value(s), %d MLmodel file(s) "
            "and %d adapter config(s)",
            root,
            changed,
            models,
            adapters,
        )
    return changed


# kedro-mlflow tags each run with ``project_path``, the absolute project folder; the project
# stores it relative to the project root instead (the MLflow UI would show the old folder
# after a move), by its hook and in :func:`rebase_store`
PROJECT_PATH_TAG = "project_path"
PROJECT_PATH_TAG_VALUE = "."


def _reroot_mlmodel_files(folder: Path, root: Path) -> int:
    """Re-root the ``artifact_path:`` line MLflow writes into each logged model's ``MLmodel``
    file under ``folder`` (shown in the MLflow UI); returns how many files changed."""
    changed = 0
    for mlmodel in folder.rglob("MLmodel"):
        try:
            lines = mlmodel.read_text(encoding="utf-8").splitlines(keepends=True)
        except (OSError, UnicodeDecodeError):
            continue
        for i, line in enumerate(lines):
            if line.startswith("artifact_path: "):
                moved = reroot(line.removeprefix("artifact_path: ").strip(), root, "mlruns")
                if moved is not None:
                    lines[i] = f"artifact_path: {moved}\n"
                    mlmodel.write_text("".join(lines), encoding="utf-8")
                    changed += 1
                break
    return changed


def portable_adapter(folder: Path, root: Path | None = None) -> int:
    """Rewrite ``base_model_name_or_path`` in every ``adapter_config.json`` under ``folder``
    (and the same path in the PEFT model card, ``README.md``, next to it) so that it does
    not name this checkout by absolute path: a path inside the project (or inside another
    checkout's ``data/``) becomes relative to the project root, which is where ``kedro run``,
    ``conductor`` and the notebooks resolve paths from. Hub ids and paths outside the
    project stay as they are. Returns how many adapter folders changed."""
    root = (root or project_root()).resolve()
    changed = 0
    for config_file in sorted(Path(folder).rglob("adapter_config.json")):
        try:
            config = json.loads(config_file.read_text())
        except (OSError, ValueError):
            continue
        base = config.get(_BASE_MODEL_KEY)
        if not isinstance(base, str):
            continue
        relative = _project_base(base, root)
        touched = relative is not None
        if relative is not None:
            config[_BASE_MODEL_KEY] = base = relative
            config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        touched = _portable_card(config_file.parent / "README.md", base) or touched
        changed += touched
    return changed


def _project_base(base: str, root: Path) -> str | None:
    """The project-relative form of an absolute base-model path inside ``root`` (or inside
    another checkout's ``data/`` whose counterpart exists here); ``None``: leave it."""
    if not base.startswith("/"):
        return None
    path = Path(base)
    if not path.is_relative_to(root):
        moved = reroot(base, root, "data")
        if moved is None or not Path(moved).exists():
            return None  # outside any project tree, or not in this copy
        path = Path(moved)
    return path.relative_to(root).as_posix()


# the model card's front matter names the base model twice: ``base_model: <path>`` and the
# tag ``- base_model:adapter:<path>``
_CARD_BASE = re.compile(r"^(base_model:[ \t]*|- base_model:adapter:)(/\S+)$", re.MULTILINE)


def _portable_card(card: Path, base: str) -> bool:
    """Name the relative ``base`` in the PEFT model card ``card`` where it gives an absolute
    path ending in it; whether the card changed."""
    if base.startswith("/") or not card.is_file():
        return False
    text = card.read_text(encoding="utf-8")

    def relative(match: re.Match[str]) -> str:
        return match[1] + base if match[2].endswith(f"/{base}") else match[0]

    portable = _CARD_BASE.sub(relative, text)
    if portable == text:
        return False
    card.write_text(portable, encoding="utf-8")
    return True


# -- run names and version descriptions ----------------------------------------------------------


def run_name(pipelines: Sequence[str], started: datetime, version: str | None = None) -> str:
    """The MLflow run name of a ``kedro run``: ``training 2026-12-01 22:10 UTC``, with
    `` → conductor v3`` once the run has registered a version; runs differ at a glance."""
    if started.tzinfo is None:
        raise ValueError("run_name: 'started' must be timezone-aware (UTC)")
    names = "+".join(pipelines) or "__default__"
    stamp = started.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    label = f"{names} {stamp} UTC"
    if version is not None:
        label += f" → {registered_model()} v{version}"
    return label


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def describe_version(adapter_info: Mapping[str, Any]) -> str:
    """A registered version's description, from training's adapter info: what was trained
    (base model, stages, steps), on which data (train-split fingerprint, prompts), against
    which pool, and how long it took. Plain text: MLflow renders it as Markdown."""
    missing = [k for k in ("base_model", "data_version", "global_step") if k not in adapter_info]
    if missing:
        raise KeyError(f"describe_version: adapter info lacks {missing}")
    dataset = adapter_info.get("dataset") or {}
    sft = adapter_info.get("sft") or {}
    seconds = adapter_info.get("seconds") or {}
    workers = list(adapter_info.get("worker_names") or [])
    steps = int(adapter_info["global_step"])
    lines = [
        f"LoRA adapter on {adapter_info['base_model']}, trained with GRPO for {steps} step(s)."
    ]
    if adapter_info.get("start_adapter"):
        lines.append(f"Continued from {adapter_info['start_adapter']} (retraining).")
    elif sft.get("steps") and not sft.get("reused"):
        loss = _number(sft.get("final_loss"))
        tail = f", final loss {loss:.3f}" if loss is not None else ""
        lines.append(
            f"Warm start: SFT for {int(sft['steps'])} step(s) on {sft.get('n_examples', '?')} examples{tail}."
        )
    elif sft.get("reused"):
        lines.append("Warm start: a previous run's SFT adapter (reused).")
    prompts = dataset.get("n_prompts")
    lines.append(
        f"Data: train split {adapter_info['data_version']}"
        + (f", {int(prompts)} prompts" if prompts is not None else "")
        + "."
    )
    if adapter_info.get("recursion_steps"):
        lines.append(f"Recursion stage: {int(adapter_info['recursion_steps'])} step(s).")
    if workers:
        pool = adapter_info.get("pool_fingerprint", "?")
        lines.append(f"Worker pool {pool}: {', '.join(workers)}.")
    total = _number(seconds.get("total"))
    if total is not None:
        lines.append(f"Training time: {total / 60:.1f} min.")
    if adapter_info.get("run_fingerprint"):
        lines.append(f"Run fingerprint {adapter_info['run_fingerprint']}.")
    return " ".join(lines)


def set_version_description(version: str, adapter_info: Mapping[str, Any]) -> str:
    """Write :func:`describe_version` onto ``version`` of :func:`registered_model`; returns
    the text."""
    from mlflow import MlflowClient

    text = describe_version(adapter_info)
    MlflowClient().update_model_version(registered_model(), str(version), description=text)
    return text
