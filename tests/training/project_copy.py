"""A project copy for Kedro training runs in tests: tiny arithmetic splits, simulated
workers only (no real model in the sandbox), the given policy model and a training section
cut to one SFT and one GRPO step."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from conductor_pipeline.tasks import Task

REPO = Path(__file__).resolve().parents[2]


def numeric_task(i: int, domain: str) -> Task:
    return Task(
        f"t/{domain}/{i}",
        domain,
        "easy",
        f"Compute {i} plus {i + 3} and give the number.",
        str(2 * i + 3),
        "number",
        "numeric",
        "unit",
    )


def write_training_project(
    root: Path,
    base_model: Path,
    *,
    workers: Sequence[str],
    per_domain: int = 4,
    grpo: Mapping[str, Any] | None = None,
    sft: Mapping[str, Any] | None = None,
) -> None:
    """``grpo`` and ``sft`` override the one-step settings below."""
    (root / "conf" / "local").mkdir(parents=True)
    (root / "src").mkdir()
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copytree(REPO / "conf" / "base", root / "conf" / "base")
    splits = root / "data" / "05_model_input"
    splits.mkdir(parents=True)
    for offset, name in enumerate(("train", "validation", "test")):
        rows = [
            numeric_task(100 * offset + i, domain).to_record()
            for i in range(per_domain)
            for domain in ("math", "logic")
        ]
        pd.DataFrame(rows).to_parquet(splits / f"{name}_tasks.parquet")
    pool = yaml.safe_load((REPO / "conf/base/workers.yml").read_text())
    sandbox = pool["worker_pool"]["sandbox"]
    sandbox.update(load_real_model=False, latency_scale=0.0)
    sandbox["workers"] = list(workers)
    (root / "conf/local/workers.yml").write_text(yaml.safe_dump(pool))
    training = yaml.safe_load((REPO / "conf/base/parameters_training.yml").read_text())
    settings = training["training"]
    settings["base_model"] = str(base_model)
    settings["grpo"].update({"max_steps": 1, "save_steps": 1, "max_completion_length": 16})
    settings["grpo"].update(grpo or {})
    settings["sft"].update({"max_steps": 1, "n_examples": 4})
    settings["sft"].update(sft or {})
    (root / "conf/local/parameters_training.yml").write_text(yaml.safe_dump(training))
