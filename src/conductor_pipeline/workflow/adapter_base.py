"""Which base model a LoRA adapter was trained on, and the refusal to mount it on another.

A LoRA adapter only means something on the model it was trained on: PEFT and vLLM load one
onto a different base of the same shape without complaint, or fail deep in weight loading
when the shapes differ. Every place that mounts an adapter (the local policy, the vLLM
launch of serving and evaluation, training that continues from an adapter) calls
:func:`check_adapter_base` first.

Base models are named several ways: a hub id (``Qwen/Qwen2.5-7B-Instruct``), a local copy
(``data/06_models/smollm2-135m-instruct``, ``/models/Qwen2.5-7B-Instruct``) or the project's
short name (``smollm2-135m-instruct``). Two names are the same model when their last path
components agree, case aside, or when both are folders on this machine and are the same one.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
BASE_MODEL_KEY = "base_model_name_or_path"
# what a policy without a configured model directory loads (LocalPolicy's default)
DEFAULT_LOCAL_BASE = "smollm2-135m-instruct"


class AdapterBaseMismatch(ValueError):
    """An adapter trained on one base model is about to be mounted on another."""


def adapter_base_model(adapter_dir: str | Path) -> str | None:
    """``base_model_name_or_path`` of the adapter in ``adapter_dir``; ``None`` when its
    ``adapter_config.json`` is missing, unreadable or does not say."""
    try:
        config = json.loads((Path(adapter_dir) / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError):
        return None
    base = config.get(BASE_MODEL_KEY) if isinstance(config, dict) else None
    return base if isinstance(base, str) and base.strip() else None


def model_key(name: str) -> str:
    """The comparable identity of a base-model name: its last path component, lower case
    (``Qwen/Qwen2.5-7B-Instruct`` and ``/models/qwen2.5-7b-instruct`` give the same key)."""
    return Path(name.strip().rstrip("/")).name.lower()


def _same_folder(first: str, second: str, root: Path | None) -> bool:
    def local(name: str) -> Path | None:
        path = Path(name)
        if not path.is_absolute() and root is not None:
            path = root / path
        return path if path.is_dir() else None

    one, other = local(first), local(second)
    return one is not None and other is not None and one.resolve() == other.resolve()


def same_base_model(first: str, second: str, *, root: Path | None = None) -> bool:
    """Whether two base-model names denote the same model (see the module docstring).
    ``root``: where relative folder names are resolved (the project root)."""
    return model_key(first) == model_key(second) or _same_folder(first, second, root)


def check_adapter_base(
    adapter_dir: str | Path,
    base_model: str,
    *,
    where: str,
    label: str | None = None,
    root: Path | None = None,
) -> None:
    """Refuse to mount the adapter in ``adapter_dir`` on ``base_model`` when it was trained
    on another base model. ``where`` names the mount point (``conductor serve``, ...) and
    ``label`` the adapter as the user named it (``models:/conductor@champion``), for the
    message. An adapter whose config does not record its base model is mounted with a
    warning (nothing to compare)."""
    trained_on = adapter_base_model(adapter_dir)
    shown = (
        f"{label} ({adapter_dir})" if label and str(label) != str(adapter_dir) else str(adapter_dir)
    )
    if trained_on is None:
        logger.warning(
            "%s: adapter %s does not record its base model (%s in %s); mounting it on %s unchecked",
            where,
            shown,
            BASE_MODEL_KEY,
            ADAPTER_CONFIG,
            base_model,
        )
        return
    if same_base_model(trained_on, base_model, root=root):
        return
    raise AdapterBaseMismatch(
        f"{where}: adapter {shown} was trained on {trained_on}, but the policy's base model is "
        f"{base_model}; a LoRA adapter only fits the model it was trained on. Name an adapter "
        f"trained on {base_model} (each profile registers its own model: the sandbox "
        "`conductor`, --env gpu `conductor-qwen`, conf/<env>/globals.yml registered_model), "
        f"or run it on {trained_on}."
    )
