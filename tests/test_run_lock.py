"""run_lock: one claim at a time, even for runs that start at the same moment."""

from __future__ import annotations

import json
import threading
import time

import pytest
from filelock import FileLock

from conductor_pipeline import run_lock
from conductor_pipeline.run_lock import LockHeld, claim_lock, release_claim


def test_runs_starting_together_get_one_claim(tmp_path, monkeypatch):
    path = tmp_path / "run.lock"
    write = run_lock._write

    def slow_write(*args) -> None:
        time.sleep(0.05)  # widen the gap between a run's check and its write
        write(*args)

    monkeypatch.setattr(run_lock, "_write", slow_write)
    start = threading.Barrier(8)
    won, refused = [], []

    def contend() -> None:
        start.wait()
        try:
            won.append(claim_lock(path, stale_after_s=3600))
        except LockHeld as err:
            refused.append(str(err))

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and len(refused) == 7
    assert json.loads(path.read_text())["token"] == won[0]["token"]
    assert all("another run holds" in message for message in refused)
    assert release_claim(path, won[0]["token"]) and not path.exists()


def test_a_stuck_guard_is_reported_not_waited_on_forever(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "_GUARD_TIMEOUT_S", 0.2)
    path = tmp_path / "run.lock"
    with FileLock(tmp_path / "run.lock.guard"), pytest.raises(LockHeld, match="stayed locked"):
        claim_lock(path, stale_after_s=3600)
    assert not path.exists()


def test_release_leaves_a_claim_that_is_not_ours(tmp_path):
    path = tmp_path / "run.lock"
    claim_lock(path, stale_after_s=3600)
    assert not release_claim(path, "someone-else") and path.exists()
    with pytest.raises(ValueError, match="stale_after_s"):
        claim_lock(tmp_path / "other.lock", stale_after_s=0)
