"""Fixtures: prepared task files and a sandbox pool configuration without the real model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conductor_pipeline.evaluation import SYSTEM_KINDS

from .fakes import make_tasks

REPO = Path(__file__).resolve().parents[2]
SANDBOX_WORKERS = ["sim-sage", "sim-abacus", "sim-coder", "sim-sprout"]


def write_tasks(path: Path, tasks) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([t.to_record() for t in tasks]).to_parquet(path)
    return path


def write_evaluation_project(root: Path) -> Path:
    """A project copy for `kedro run --pipelines evaluation`: small splits, the simulated
    sandbox workers only, and an evaluation cut to 3 test questions per domain."""
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    shutil.copytree(REPO / "conf", root / "conf", ignore=shutil.ignore_patterns("local"))
    local = root / "conf" / "local"
    local.mkdir()
    (root / "src").mkdir()
    for split, n in (("train", 2), ("validation", 2), ("test", 3)):
        write_tasks(root / f"data/05_model_input/{split}_tasks.parquet", make_tasks(n, split))
    workers = yaml.safe_load((REPO / "conf/base/workers.yml").read_text())
    workers["worker_pool"]["sandbox"].update(
        workers=SANDBOX_WORKERS, load_real_model=False, latency_scale=0.0
    )
    (local / "workers.yml").write_text(yaml.safe_dump(workers))
    (local / "parameters_evaluation.yml").write_text(
        yaml.safe_dump(
            {
                "evaluation": {
                    "test_per_domain": 3,
                    "validation_per_domain": 2,
                    "trace_sample": 2,
                    # every kind, as before parameters were soft-merged over conf/base's list
                    "systems": list(SYSTEM_KINDS),
                }
            }
        )
    )
    return root


def sandbox_pool_config(task_paths, cache_mode: str = "read_write") -> dict:
    return {
        "kind": "sandbox",
        "cache": {"path": "data/03_primary/response_cache.sqlite", "mode": cache_mode},
        "sandbox": {
            "profiles": str(REPO / "conf/base/sandbox_workers.yml"),
            "workers": list(SANDBOX_WORKERS),
            "seed": 0,
            "latency_scale": 0.0,
            "load_real_model": False,
            "tasks": [str(p) for p in task_paths],
        },
    }


@pytest.fixture
def prepared(tmp_path):
    """Test and validation task files for the sandbox (2 domains)."""
    test = write_tasks(tmp_path / "data/05_model_input/test_tasks.parquet", make_tasks(3))
    validation = write_tasks(
        tmp_path / "data/05_model_input/validation_tasks.parquet", make_tasks(2, "validation")
    )
    return tmp_path, test, validation
