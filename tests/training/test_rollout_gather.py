"""Several processes: each scores its share of a step's rollouts, and the ``grpo/*`` rollout
metrics cover all of them (not the main process's share only). Two processes over gloo on
the CPU, as ``accelerate launch`` joins them."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from conductor_pipeline.training.rollout_stats import RolloutStats, gather_from_processes
from conductor_pipeline.training.scoring import RolloutScore


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _share(rank: int) -> list[RolloutScore]:
    """Rank 0: 4 scored rollouts on worker 0 that cost $0.01 each; rank 1: 4 masked ones
    on worker 1 that cost $0.02 each (the masked rate of the whole step is 0.5)."""
    if rank == 0:
        return [
            RolloutScore(reward=1.0, correctness=1.0, parsed=True, correct=True, n_steps=1,
                         workers=[0], cost_usd=0.01, calls=1)
            for _ in range(4)
        ]  # fmt: skip
    return [
        RolloutScore(reward=None, correctness=None, parsed=True, masked=True, n_steps=1,
                     workers=[1], cost_usd=0.02, calls=1, infra_failures=1)
        for _ in range(4)
    ]  # fmt: skip


def _worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        stats = RolloutStats(["a", "b"], group_size=4)
        stats.add(_share(rank), completion_tokens=100 * (rank + 1), seconds=1.0 + rank)
        metrics = stats.drain()
        gathered = gather_from_processes({"rank": rank})
        Path(out, f"rank{rank}.json").write_text(json.dumps([metrics, gathered]))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_rollout_metrics_cover_the_rollouts_of_every_process(tmp_path):
    import torch.multiprocessing as mp

    mp.start_processes(
        _worker, args=(_free_port(), str(tmp_path)), nprocs=2, start_method="spawn", join=True
    )
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    (metrics, gathered), (other, _) = results
    assert metrics == other  # every process sees the whole step: the caps agree on a stop
    assert gathered == [{"rank": 0}, {"rank": 1}]
    assert metrics["rollouts/n"] == 8  # not rank 0's 4
    assert metrics["rollouts/masked_rate"] == pytest.approx(0.5)
    assert metrics["workflow/cost_usd_sum"] == pytest.approx(0.12)
    assert metrics["workers/share/a"] == pytest.approx(0.5)
    assert metrics["workers/share/b"] == pytest.approx(0.5)
    assert metrics["rollouts/completion_tokens"] == 300
    assert metrics["rollouts/score_seconds"] == pytest.approx(2.0)  # the slower process


def test_one_process_gathers_only_its_own_share():
    stats = RolloutStats(["a", "b"])
    stats.add(_share(0))
    metrics = stats.drain()
    assert metrics["rollouts/n"] == 4 and metrics["workflow/cost_usd_sum"] == pytest.approx(0.04)
    assert gather_from_processes(3) == [3]
