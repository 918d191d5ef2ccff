"""A persistent response cache for worker calls, in one SQLite file.

Training rollouts, evaluation and serving share it so that an identical request (same worker,
model, messages, sampling parameters and sample index) is paid for once. Only successful
replies are stored.

Modes:

- ``read_write``: look up, and store successful replies.
- ``read_only`` (replay): look up only. The pool answers a miss with a ``PROVIDER_ERROR``
  failure whose error is ``"cache miss in read_only mode"`` and never calls the worker, so a
  replayed run costs nothing and cannot drift.
- ``off``: every lookup misses and nothing is stored.

Integrity: each row stores its payload (JSON text) and the sha256 of that text. A row whose
checksum does not match, whose payload does not parse, or which lacks a field is treated as a
miss, counted in ``stats["corrupt"]``, logged, and deleted (in ``read_write`` mode).

Concurrency: the file uses WAL journaling and a busy timeout, every operation is retried on
"database is locked", and each thread has its own connection; the async methods run the
SQLite work in a thread (``asyncio.to_thread``). Several processes may share one file.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random_exponential,
)

from conductor_pipeline.config_checks import check_int

__all__ = ["CacheMode", "CachedReply", "ResponseCache", "cache_key"]

log = logging.getLogger(__name__)

CacheMode = Literal["read_write", "read_only", "off"]
_MODES = ("read_write", "read_only", "off")
_T = TypeVar("_T")

# between retries of a locked database: 10 ms doubling up to 1 s, each wait stretched by a
# random share of up to itself so that processes waiting on one writer do not retry in step
_LOCK_WAIT = wait_exponential(multiplier=0.01, max=1.0) + wait_random_exponential(
    multiplier=0.01, max=1.0
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    worker TEXT NOT NULL,
    payload TEXT,
    checksum TEXT,
    created_at REAL NOT NULL
)
"""


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def cache_key(
    worker: str,
    model: str,
    messages: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any],
    sample_index: int = 0,
) -> str:
    """sha256 of the canonical JSON of everything that determines a reply."""
    body = {
        "worker": worker,
        "model": model,
        "messages": [dict(m) for m in messages],
        "params": dict(params),
        "sample_index": int(sample_index),
    }
    return hashlib.sha256(_canonical(body).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CachedReply:
    """What a cache row holds for one successful reply."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    served_by: str | None
    created_at: float

    def payload(self) -> str:
        return _canonical(
            {
                "text": self.text,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "cost_usd": self.cost_usd,
                "served_by": self.served_by,
                "created_at": self.created_at,
            }
        )

    @classmethod
    def from_payload(cls, payload: str) -> CachedReply:
        data = json.loads(payload)
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            raise ValueError("payload lacks text")
        return cls(
            text=data["text"],
            prompt_tokens=int(data["prompt_tokens"]),
            completion_tokens=int(data["completion_tokens"]),
            cost_usd=float(data["cost_usd"]),
            served_by=data.get("served_by"),
            created_at=float(data["created_at"]),
        )


def _checksum(payload: str) -> str:
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _is_lock_error(exc: BaseException) -> bool:
    """SQLite's "database is locked" or "busy": worth another try, unlike other errors."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    message = str(exc).lower()
    return "locked" in message or "busy" in message


class ResponseCache:
    """SQLite-backed cache of successful worker replies. See the module docstring."""

    def __init__(
        self,
        path: str | Path,
        mode: CacheMode = "read_write",
        *,
        busy_timeout_s: float = 30.0,
        max_lock_retries: int = 20,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"cache mode must be one of {_MODES}, got {mode!r}")
        check_int(max_lock_retries, "max_lock_retries")
        self.path = Path(path)
        self.mode: CacheMode = mode
        self.busy_timeout_s = busy_timeout_s
        self.max_lock_retries = max_lock_retries
        # one controller for every operation: tenacity keeps each call's state per thread
        self._retrying = Retrying(
            retry=retry_if_exception(_is_lock_error),
            stop=stop_after_attempt(max_lock_retries + 1),
            wait=_LOCK_WAIT,
            reraise=True,  # the last "database is locked" error, not tenacity's RetryError
        )
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._stats = {"hits": 0, "misses": 0, "writes": 0, "corrupt": 0}
        self._closed = False
        if mode != "off":
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._with_retry(self._init_schema)

    # -- connections -------------------------------------------------------------------------
    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise RuntimeError("ResponseCache is closed")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_s,
                isolation_level=None,  # autocommit; explicit BEGIN where needed
                check_same_thread=False,  # closed from another thread in close(); used by one
            )
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
            except sqlite3.Error:
                conn.close()
                raise
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def _init_schema(self) -> None:
        self._connection().execute(_SCHEMA)

    def _with_retry(self, fn: Callable[[], _T]) -> _T:
        """``fn()``, run again while SQLite reports the database locked or busy (another
        connection holds the write lock past the busy timeout), at most
        ``max_lock_retries`` more times; any other error is raised at once."""
        return self._retrying(fn)

    def _count(self, stat: str) -> None:
        with self._lock:
            self._stats[stat] += 1

    # -- sync API ----------------------------------------------------------------------------
    def get(self, key: str) -> CachedReply | None:
        """The stored reply for ``key``, or None (a miss, a corrupt row, or mode ``off``)."""
        if self.mode == "off":
            self._count("misses")
            return None
        row = self._with_retry(
            lambda: (
                self._connection()
                .execute("SELECT payload, checksum FROM responses WHERE key = ?", (key,))
                .fetchone()
            )
        )
        if row is None:
            self._count("misses")
            return None
        payload, checksum = row
        reply: CachedReply | None = None
        if (
            isinstance(payload, str)
            and isinstance(checksum, str)
            and _checksum(payload) == checksum
        ):
            try:
                reply = CachedReply.from_payload(payload)
            except (ValueError, KeyError, TypeError):
                reply = None
        if reply is None:
            self._count("corrupt")
            self._count("misses")
            log.warning("response cache %s: corrupt row %s ignored", self.path, key[:12])
            if self.mode == "read_write":
                self._with_retry(
                    lambda: self._connection().execute(
                        "DELETE FROM responses WHERE key = ? AND checksum IS ?", (key, checksum)
                    )
                )
            return None
        self._count("hits")
        return reply

    def put(
        self,
        key: str,
        worker: str,
        text: str,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        cost_usd: float = 0.0,
        served_by: str | None = None,
    ) -> bool:
        """Store a successful reply; returns False (and stores nothing) unless ``read_write``."""
        if self.mode != "read_write":
            return False
        if not isinstance(text, str):
            raise TypeError("only text replies are cached")
        reply = CachedReply(
            text=text,
            prompt_tokens=int(prompt_tokens),
            completion_tokens=int(completion_tokens),
            cost_usd=float(cost_usd),
            served_by=served_by,
            created_at=time.time(),
        )
        payload = reply.payload()
        self._with_retry(
            lambda: self._connection().execute(
                "INSERT OR REPLACE INTO responses (key, worker, payload, checksum, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (key, worker, payload, _checksum(payload), reply.created_at),
            )
        )
        self._count("writes")
        return True

    def __len__(self) -> int:
        if self.mode == "off":
            return 0
        return self._with_retry(
            lambda: self._connection().execute("SELECT COUNT(*) FROM responses").fetchone()[0]
        )

    # -- async API ---------------------------------------------------------------------------
    async def aget(self, key: str) -> CachedReply | None:
        if self.mode == "off":
            return self.get(key)
        return await asyncio.to_thread(self.get, key)

    async def aput(self, key: str, worker: str, text: str, **usage: Any) -> bool:
        if self.mode != "read_write":
            return False
        return await asyncio.to_thread(self.put, key, worker, text, **usage)

    # -- bookkeeping -------------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, int]:
        """Counts since this object was created: hits, misses, writes, corrupt."""
        with self._lock:
            return dict(self._stats)

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
            self._closed = True
        for conn in connections:
            with contextlib.suppress(sqlite3.Error):  # closing is best effort
                conn.close()

    def __enter__(self) -> ResponseCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.path)!r}, mode={self.mode!r})"
