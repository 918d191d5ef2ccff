"""The SQLite response cache: keys, modes, integrity and concurrent writers."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import threading

import pytest

from conductor_pipeline.workers import ResponseCache, cache_key

MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def _write_many(path: str, prefix: str, n: int, ready, go) -> None:
    """Runs in a spawned process: store ``n`` replies under distinct keys once ``go`` is set."""
    cache = ResponseCache(path)
    ready.release()
    go.wait(30)
    for i in range(n):
        key = cache_key("w", "openai/w", [{"role": "user", "content": f"{prefix}-{i}"}], {}, 0)
        cache.put(key, "w", f"{prefix} answer {i}", prompt_tokens=i, completion_tokens=1)
    cache.close()


def test_key_covers_every_input():
    base = cache_key("w", "openai/w", MESSAGES, {"temperature": 0.5}, 0)
    assert base == cache_key("w", "openai/w", list(MESSAGES), {"temperature": 0.5}, 0)
    variants = {
        cache_key("v", "openai/w", MESSAGES, {"temperature": 0.5}, 0),
        cache_key("w", "openai/v", MESSAGES, {"temperature": 0.5}, 0),
        cache_key("w", "openai/w", [{"role": "user", "content": "2+2?"}], {"temperature": 0.5}, 0),
        cache_key("w", "openai/w", MESSAGES, {"temperature": 0.7}, 0),
        cache_key("w", "openai/w", MESSAGES, {"temperature": 0.5}, 1),
    }
    assert base not in variants and len(variants) == 5


def test_round_trip_and_stats(tmp_path):
    with ResponseCache(tmp_path / "c.sqlite") as cache:
        key = cache_key("w", "m", MESSAGES, {}, 0)
        assert cache.get(key) is None
        assert cache.put(key, "w", "four", prompt_tokens=7, completion_tokens=1, cost_usd=0.5)
        hit = cache.get(key)
        assert hit is not None and hit.text == "four" and hit.prompt_tokens == 7
        assert hit.cost_usd == 0.5 and hit.created_at > 0
        assert cache.stats == {"hits": 1, "misses": 1, "writes": 1, "corrupt": 0}
        assert len(cache) == 1
    with ResponseCache(tmp_path / "c.sqlite") as again:  # persistent
        assert again.get(key).text == "four"


def test_modes(tmp_path):
    path = tmp_path / "c.sqlite"
    key = cache_key("w", "m", MESSAGES, {}, 0)
    with ResponseCache(path, mode="read_only") as ro:
        assert ro.put(key, "w", "x") is False
        assert ro.get(key) is None
    with ResponseCache(path) as rw:
        rw.put(key, "w", "stored")
    with ResponseCache(path, mode="read_only") as ro:
        assert ro.get(key).text == "stored"
    off = ResponseCache(tmp_path / "never.sqlite", mode="off")
    assert off.put(key, "w", "x") is False and off.get(key) is None
    assert not (tmp_path / "never.sqlite").exists()
    with pytest.raises(ValueError, match="mode"):
        ResponseCache(path, mode="sometimes")


def test_corrupted_or_partial_rows_are_never_returned(tmp_path):
    path = tmp_path / "c.sqlite"
    cache = ResponseCache(path)
    good, flipped, partial = (cache_key("w", "m", MESSAGES, {}, i) for i in range(3))
    for key in (good, flipped, partial):
        cache.put(key, "w", "the answer is 4", prompt_tokens=5, completion_tokens=4)
    with sqlite3.connect(path) as raw:
        (payload,) = raw.execute("SELECT payload FROM responses WHERE key=?", (flipped,)).fetchone()
        i = payload.index("answer")
        damaged = payload[:i] + chr(ord(payload[i]) ^ 0x01) + payload[i + 1 :]  # one flipped bit
        raw.execute("UPDATE responses SET payload=? WHERE key=?", (damaged, flipped))
        raw.execute("UPDATE responses SET payload=NULL WHERE key=?", (partial,))
    assert cache.get(flipped) is None
    assert cache.get(partial) is None
    assert cache.get(good).text == "the answer is 4"
    assert cache.stats["corrupt"] == 2
    assert len(cache) == 1  # damaged rows were deleted in read_write mode
    cache.close()


async def test_concurrent_async_use(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    keys = [cache_key("w", "m", MESSAGES, {}, i) for i in range(100)]
    await asyncio.gather(*(cache.aput(k, "w", f"r{i}") for i, k in enumerate(keys)))
    hits = await asyncio.gather(*(cache.aget(k) for k in keys))
    assert [h.text for h in hits] == [f"r{i}" for i in range(100)]
    cache.close()


def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    ResponseCache(path).close()  # create the schema first
    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Semaphore(0), ctx.Event()
    procs = [ctx.Process(target=_write_many, args=(path, p, 200, ready, go)) for p in ("p0", "p1")]
    for proc in procs:
        proc.start()
    for _ in procs:  # both connected: start them together so their writes interleave
        assert ready.acquire(timeout=30)
    go.set()
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    with ResponseCache(path, mode="read_only") as cache:
        assert len(cache) == 400
        for prefix in ("p0", "p1"):
            for i in range(200):
                key = cache_key(
                    "w", "openai/w", [{"role": "user", "content": f"{prefix}-{i}"}], {}, 0
                )
                assert cache.get(key).text == f"{prefix} answer {i}"
        assert cache.stats["corrupt"] == 0


def test_only_lock_errors_are_retried_and_the_last_one_is_raised(tmp_path):
    cache = ResponseCache(tmp_path / "cache.sqlite", max_lock_retries=3)
    calls: list[str] = []

    def flaky(errors: list[str]):
        def fn() -> str:
            calls.append("call")
            if errors:
                raise sqlite3.OperationalError(errors.pop(0))
            return "done"

        return fn

    assert cache._with_retry(flaky(["database is locked", "database is busy"])) == "done"
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        cache._with_retry(flaky(["no such table: nowhere", "database is locked"]))
    assert len(calls) == 1  # not a lock: no second try
    calls.clear()
    with pytest.raises(sqlite3.OperationalError, match="locked #4"):
        cache._with_retry(flaky([f"database is locked #{i}" for i in range(1, 9)]))
    assert len(calls) == 4  # the first try and max_lock_retries more
    cache.close()


def test_a_write_waits_for_another_connection_to_release_its_lock(tmp_path):
    """Another connection holds the write lock past the busy timeout (0 here); the write is
    retried until that connection lets go, and lands."""
    path = tmp_path / "cache.sqlite"
    cache = ResponseCache(path, busy_timeout_s=0.0, max_lock_retries=60)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.1, other.rollback)
    release.start()
    key = cache_key("w", "openai/w", MESSAGES, {}, 0)
    cache.put(key, "w", "four", prompt_tokens=3, completion_tokens=1)
    release.join()
    other.close()
    assert cache.get(key).text == "four"
    cache.close()


def test_a_held_lock_fails_the_write_with_sqlites_error_once_retries_run_out(tmp_path):
    path = tmp_path / "cache.sqlite"
    cache = ResponseCache(path, busy_timeout_s=0.0, max_lock_retries=1)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            cache.put(cache_key("w", "openai/w", MESSAGES, {}, 0), "w", "four")
    finally:
        other.rollback()
        other.close()
        cache.close()


@pytest.mark.parametrize("retries", [-1, 1.5, True, "3"])
def test_max_lock_retries_must_be_a_non_negative_integer(tmp_path, retries):
    with pytest.raises(ValueError, match="max_lock_retries"):
        ResponseCache(tmp_path / "cache.sqlite", max_lock_retries=retries)
