"""Training's reward under configured worker faults: a real sandbox pool with 30 % injected
faults (``worker_pool.faults``), scored by ``ConductorReward``. Rollouts whose calls fail
after the reward's retries are masked and the masked rate is reported; with
``retry_on_any_failure`` (a failed intermediate step masks too, as evaluation's rule does)
the rollouts that are scored get the reward they get without faults."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pandas as pd
import pytest

from conductor_pipeline.training.configs import RewardConfig
from conductor_pipeline.training.rewards import ConductorReward, task_columns
from conductor_pipeline.workers.runtime import open_worker_pool
from conductor_pipeline.workflow import PromptConfig

from ..evaluation.fakes import make_tasks

REPO = Path(__file__).resolve().parents[2]
TASKS = make_tasks(2)
GENERATIONS = 6
THIRTY_PERCENT = {"timeout": 0.1, "rate_limit": 0.1, "provider_error": 0.1}


def _pool_config(tasks_path: Path, cache: str, faults: dict | None) -> dict:
    config = {
        "kind": "sandbox",
        "cache": {"path": cache, "mode": "read_write"},
        "sandbox": {
            "profiles": str(REPO / "conf/base/sandbox_workers.yml"),
            "workers": ["sim-sage", "sim-abacus", "sim-sprout"],
            "latency_scale": 0.0,
            "load_real_model": False,
            "tasks": [str(tasks_path)],
        },
    }
    if faults is not None:
        config["faults"] = faults
    return config


def _score(pool, retries: int) -> tuple[list[float | None], dict[str, float]]:
    config = RewardConfig(
        infra_retries=retries, retry_delay_s=0, max_concurrency=8, retry_on_any_failure=True
    )
    reward = ConductorReward(
        pool,
        pool.names,
        pool.descriptions,
        PromptConfig(few_shot=[]),
        config,
        num_generations=GENERATIONS,
    )
    batch = [task for task in TASKS for _ in range(GENERATIONS)]
    # a two-step workflow per rollout: sprout tries, sage sees its attempt and answers
    texts = [
        f"model_id = [2, 0]\nsubtasks = [{t.question!r}, {('Check and answer: ' + t.question)!r}]"
        '\naccess_list = [[], "all"]'
        for t in batch
    ]
    rows = [task_columns(t) for t in batch]
    columns = {key: [r[key] for r in rows] for key in rows[0]}
    rewards = asyncio.run(
        reward(
            prompts=[[]] * len(batch),
            completions=[[{"role": "assistant", "content": t}] for t in texts],
            completion_ids=[[1]] * len(batch),
            trainer_state=None,
            log_metric=lambda name, value: None,
            **columns,
        )
    )
    return rewards, reward.stats.drain()


@pytest.fixture
def tasks_path(tmp_path) -> Path:
    path = tmp_path / "tasks.parquet"
    pd.DataFrame([t.to_record() for t in TASKS]).to_parquet(path)
    return path


@pytest.mark.slow
def test_thirty_percent_faults_mask_rollouts_and_report_the_rate(tasks_path, tmp_path):
    with open_worker_pool(_pool_config(tasks_path, "clean.sqlite", None), root=tmp_path) as pool:
        clean, clean_metrics = _score(pool, retries=0)
    assert None not in clean and clean_metrics["rollouts/masked_rate"] == 0

    # above the Router (level pool) and without the reward's retries: faults reach the reward
    faults = {"level": "pool", "seed": 3, "rates": THIRTY_PERCENT}
    with open_worker_pool(_pool_config(tasks_path, "a.sqlite", faults), root=tmp_path) as pool:
        bare, bare_metrics = _score(pool, retries=0)
    masked = sum(r is None for r in bare)
    assert masked > 0
    assert bare_metrics["rollouts/masked_rate"] == pytest.approx(masked / len(bare))
    assert bare_metrics["rollouts/infra_failure_rate"] > 0
    # a rollout that is scored is scored as without faults
    assert all(r is None or r == c for r, c in zip(bare, clean, strict=True))

    # with the reward's retries (answered steps served from the cache) fewer are masked
    with open_worker_pool(_pool_config(tasks_path, "b.sqlite", faults), root=tmp_path) as pool:
        retried, retried_metrics = _score(pool, retries=4)
    assert retried_metrics["rollouts/masked_rate"] < bare_metrics["rollouts/masked_rate"]
    assert retried_metrics["rollouts/retries_per_rollout"] > 0
    assert all(r is None or r == c for r, c in zip(retried, clean, strict=True))
