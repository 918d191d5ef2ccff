"""What a training run leaves on disk, and how a later run finds it again.

One run lives in ``<output_dir>/runs/<run fingerprint>/``: ``run.json``, the stages'
checkpoint folders, the rollout samples file and the final ``adapter/`` with its
``conductor_info.json`` (:class:`TrainingResult` ``.to_dict()``) and, after an SFT warm start,
the warm-start adapter in ``adapter/warm_start/``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor_pipeline.hashing import files_hash

__all__ = [
    "ADAPTER_INFO_FILE",
    "ROLLOUT_SAMPLES_FILE",
    "WARM_START_DIR",
    "TrainingResult",
    "adapter_hash",
    "adapter_ready",
    "last_checkpoint",
    "load_adapter_info",
]

ADAPTER_INFO_FILE = "conductor_info.json"
ROLLOUT_SAMPLES_FILE = "rollout_samples.jsonl"
# sub-folder of a trained adapter holding the same run's warm-start (SFT-only) adapter
WARM_START_DIR = "warm_start"


@dataclass
class TrainingResult:
    """What :func:`train_conductor` produced (``to_dict`` is the adapter-info record)."""

    adapter_dir: Path
    run_dir: Path
    base_model: str
    config_fingerprint: str
    data_version: str
    pool_fingerprint: str
    run_fingerprint: str
    global_step: int
    resumed_from: str | None
    dataset: dict[str, Any]
    seconds: dict[str, float]
    history: list[dict[str, float]]
    worker_names: list[str]
    conductor_descriptions: list[str]
    prompt: dict[str, Any]
    sft: dict[str, Any] | None = None
    recursion_steps: int = 0
    start_adapter: str | None = None
    # per-step SFT warm-start records (step, loss, grad_norm, learning_rate); not in to_dict
    sft_history: list[dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "adapter_dir": str(self.adapter_dir),
            "run_dir": str(self.run_dir),
            "base_model": self.base_model,
            "config_fingerprint": self.config_fingerprint,
            "data_version": self.data_version,
            "pool_fingerprint": self.pool_fingerprint,
            "run_fingerprint": self.run_fingerprint,
            "global_step": self.global_step,
            "recursion_steps": self.recursion_steps,
            "resumed_from": self.resumed_from,
            "dataset": self.dataset,
            "seconds": self.seconds,
            "rollout_samples": str(self.run_dir / ROLLOUT_SAMPLES_FILE),
            "worker_names": self.worker_names,
            "conductor_descriptions": self.conductor_descriptions,
            "prompt": self.prompt,
            "sft": self.sft,
            "start_adapter": self.start_adapter,
        }


def last_checkpoint(folder: Path) -> Path | None:
    """The newest ``checkpoint-<step>`` folder the Trainer wrote in ``folder``, if any."""
    if not folder.is_dir():
        return None
    from transformers.trainer_utils import get_last_checkpoint

    found = get_last_checkpoint(str(folder))
    return Path(found) if found else None


def adapter_hash(folder: Path) -> str:
    """Identity of a LoRA folder: sha256 of its config and weight files."""
    if not (folder / "adapter_config.json").is_file():
        raise FileNotFoundError(f"start adapter {folder}: no adapter_config.json there")
    return files_hash(sorted(folder.glob("adapter_*")))


def adapter_ready(folder: Path) -> bool:
    """Whether ``folder`` holds a saved adapter (or full model)."""
    return (folder / "adapter_config.json").is_file() or (folder / "config.json").is_file()


def load_adapter_info(adapter_dir: str | Path) -> Mapping[str, Any]:
    """The ``conductor_info.json`` written next to a trained adapter."""
    return json.loads((Path(adapter_dir) / ADAPTER_INFO_FILE).read_text())
