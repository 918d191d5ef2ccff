"""Opt-in capture of served requests (``serving.capture``), so feedback can be joined to them.

Off by default: with ``enabled: false`` nothing about a request reaches disk beyond the
access log's counters. With it on, each answered request appends one JSON line to
``<path>/requests.jsonl``::

    {"schema": 1, "request_id", "time", "model": {"id", "version", "alias"},
     "question", "answer", "steps": [{"worker", "worker_name", "subtask", "access",
     "tokens", "cost_usd", "ok"}], "cost_usd", "tokens", "conductor_tokens",
     "simulated", "sandbox_known_question", "format_failure", "stopped_by"}

What is kept is chosen field by field from the response's ``conductor`` record
(:func:`capture_record`): request headers, the API key, credentials and the environment
are never passed in, and anything else a caller adds to that record is left out. Worker
responses and worker error texts are left out too (an error may echo a provider's reply).
Whatever looks like a credential is replaced by ``***`` in every string as a last line of
defence (``serving.redaction``: the values the access log masks, the values of the
environment's secret-looking variables, even split by a line break, common key shapes and
random-looking tokens), and the optional redaction hook (``redact: module:function``,
called with each record, returning the record to write or ``None`` to skip it) runs before
anything is written.

Writes: one line per request under a thread lock and a file lock (several server processes
may share the folder), flushed and, with ``fsync: true`` (the default), fsynced before the
append returns, so a captured line survives a crash (the folder's entries, i.e. a file's
creation or rotation, are not fsynced: a crash right after one may lose that file's first
line); a line cut short by a crash is skipped by the reader and the next append starts on a
fresh line. ``append_async`` runs the write in a worker thread, off the event loop. When the file would pass ``max_file_bytes`` it is rotated
(``requests.1.jsonl`` is the newest rotated file; ``keep_files`` of them are kept). At
start-up and at each rotation the retention limits apply: records older than
``max_age_days`` are dropped, then all but the newest ``max_records``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from filelock import FileLock

from conductor_pipeline.config_checks import check_int, check_keys
from conductor_pipeline.serving.redaction import SecretMasker
from conductor_pipeline.tasks.sources.traffic import (
    REQUESTS_STEM,
    read_jsonl,
    read_records,
    rotated_files,
)

SCHEMA_VERSION = 1
_STEP_FIELDS = ("worker", "worker_name", "subtask", "access", "tokens", "cost_usd")
_MODEL_FIELDS = ("id", "version", "alias")
_RECORD_FIELDS = (
    "cost_usd",
    "tokens",
    "conductor_tokens",
    "simulated",
    "sandbox_known_question",
    "format_failure",
    "stopped_by",
)

Redactor = Callable[[dict[str, Any]], "dict[str, Any] | None"]


@dataclass(frozen=True)
class FeedbackSettings:
    """``serving.capture.feedback``: the bounds of ``feedback.jsonl`` (``serving.feedback``).

    The file rotates past ``max_file_bytes`` (``feedback.1.jsonl`` the newest rotated file,
    ``keep_files`` kept); at start-up and at each rotation all but the newest ``max_records``
    are dropped, so disk and the store's in-memory index stay bounded."""

    max_file_bytes: int = 4 * 1024 * 1024
    keep_files: int = 2
    max_records: int = 20_000

    def __post_init__(self) -> None:
        check_int(self.max_file_bytes, "serving.capture.feedback.max_file_bytes", minimum=1024)
        check_int(self.keep_files, "serving.capture.feedback.keep_files", minimum=0)
        check_int(self.max_records, "serving.capture.feedback.max_records", minimum=1)

    @classmethod
    def from_mapping(cls, params: Mapping[str, Any] | None) -> FeedbackSettings:
        if params is not None and not isinstance(params, Mapping):
            raise ValueError(f"serving.capture.feedback: must be a mapping, got {params!r}")
        params = dict(params or {})
        check_keys("serving.capture.feedback", params, (f.name for f in fields(cls)))
        return cls(**params)


@dataclass(frozen=True)
class CaptureSettings:
    """``serving.capture``; every error names the key."""

    enabled: bool = False
    path: str = "data/01_raw/traffic"
    max_file_bytes: int = 16 * 1024 * 1024
    keep_files: int = 4
    max_age_days: float | None = 30.0
    max_records: int | None = None
    redact: str | None = None
    fsync: bool = True
    feedback: FeedbackSettings = field(default_factory=FeedbackSettings)

    def __post_init__(self) -> None:
        for name in ("enabled", "fsync"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"serving.capture.{name}: must be true or false, got {getattr(self, name)!r}"
                )
        if not isinstance(self.path, str) or not self.path.strip():
            raise ValueError(f"serving.capture.path: must be a folder path, got {self.path!r}")
        check_int(self.max_file_bytes, "serving.capture.max_file_bytes", minimum=1024)
        check_int(self.keep_files, "serving.capture.keep_files", minimum=0)
        if self.max_records is not None:
            check_int(self.max_records, "serving.capture.max_records", minimum=1)
        if self.max_age_days is not None and (
            isinstance(self.max_age_days, bool)
            or not isinstance(self.max_age_days, int | float)
            or not math.isfinite(self.max_age_days)
            or self.max_age_days <= 0
        ):
            raise ValueError(
                f"serving.capture.max_age_days: must be a positive number or null, "
                f"got {self.max_age_days!r}"
            )
        if self.redact is not None and (
            not isinstance(self.redact, str) or self.redact.count(":") != 1
        ):
            raise ValueError(
                f"serving.capture.redact: must be 'module:function' or null, got {self.redact!r}"
            )

    @classmethod
    def from_mapping(cls, params: Mapping[str, Any] | None) -> CaptureSettings:
        params = dict(params or {})
        check_keys("serving.capture", params, (f.name for f in fields(cls)))
        feedback = FeedbackSettings.from_mapping(params.pop("feedback", None))
        return cls(**params, feedback=feedback)


def load_redactor(reference: str | None) -> Redactor | None:
    """The callable named ``module:function``; ``ValueError`` naming the key if it cannot
    be imported or is not callable (at start-up, not at the first request)."""
    if reference is None:
        return None
    module_name, _, attribute = reference.partition(":")
    try:
        hook = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"serving.capture.redact: cannot import {reference!r}: {err}") from err
    if not callable(hook):
        raise ValueError(f"serving.capture.redact: {reference!r} is not callable")
    return hook


def utc_now(clock: Callable[[], float] = time.time) -> str:
    """The current time as a sortable ISO string (UTC, microseconds, ``Z``)."""
    return dt.datetime.fromtimestamp(clock(), dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:26] + "Z"


def parse_time(value: Any) -> float | None:
    """Seconds since the epoch of an ISO time written by :func:`utc_now`; None if unreadable."""
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()


def append_line(path: Path, line: bytes, *, fsync: bool) -> None:
    """Append one complete line (the caller holds the locks). One ``write`` with O_APPEND,
    so readers never see two lines interleaved; a tail left without its newline by a crash
    is closed first, so this line is not glued to it."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def rewrite(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace a JSONL file by ``records`` (a copy renamed over it); no records: delete it."""
    if not records:
        path.unlink(missing_ok=True)
        return
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def capture_record(
    question: str,
    answer: str,
    conductor: Mapping[str, Any],
    *,
    time_text: str | None = None,
) -> dict[str, Any]:
    """The record kept for one request: the composed question, the answer and the fields
    listed in the module docstring, picked from the response's ``conductor`` record."""
    model = conductor.get("model") if isinstance(conductor.get("model"), Mapping) else {}
    steps = conductor.get("steps") if isinstance(conductor.get("steps"), list) else []
    return {
        "schema": SCHEMA_VERSION,
        "request_id": str(conductor["request_id"]),
        "time": time_text or utc_now(),
        "model": {k: model.get(k) for k in _MODEL_FIELDS},
        "question": str(question),
        "answer": str(answer or ""),
        "steps": [
            {
                **{k: step.get(k) for k in _STEP_FIELDS},
                # a step succeeded when it neither failed nor was skipped; its error text stays out
                "ok": not step.get("failure") and not step.get("skipped_reason"),
            }
            for step in steps
            if isinstance(step, Mapping)
        ],
        **{k: conductor.get(k) for k in _RECORD_FIELDS},
    }


def _plain(value: Any) -> Any:
    """``value`` as JSON data: non-finite numbers as null, anything else not JSON as text."""
    if isinstance(value, str) or value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def masked(value: Any, masker: SecretMasker) -> Any:
    """``value`` as JSON data with every credential-like string masked (``serving.redaction``)."""
    return masker.mask_data(_plain(value))


def rotate_files(folder: Path, stem: str, keep: int) -> None:
    """``<stem>.jsonl`` -> ``<stem>.1.jsonl``, .1 -> .2, ...; beyond ``keep``: deleted."""
    # oldest (highest number) first, so that no rename lands on a file still to move
    for path in rotated_files(folder, stem)[:-1]:
        number = int(path.name.split(".")[1])
        if number >= keep:
            path.unlink()
        else:
            path.rename(folder / f"{stem}.{number + 1}.jsonl")
    current = folder / f"{stem}.jsonl"
    if keep:
        current.rename(folder / f"{stem}.1.jsonl")
    else:
        current.unlink()


def apply_retention(folder: Path, stem: str, cutoff: float | None, max_records: int | None) -> None:
    """Drop records older than ``cutoff`` (seconds since the epoch), then all but the newest
    ``max_records``; files are rewritten whole (a copy, then a rename), deleted when empty."""
    if cutoff is None and max_records is None:
        return
    files = rotated_files(folder, stem)
    contents = [read_jsonl(path)[0] for path in files]
    kept = [
        [r for r in records if cutoff is None or (parse_time(r.get("time")) or 0) >= cutoff]
        for records in contents
    ]
    if max_records is not None:
        excess = sum(map(len, kept)) - max_records
        for records in kept:  # oldest file first
            drop = min(max(excess, 0), len(records))
            del records[:drop]
            excess -= drop
    for path, before, after in zip(files, contents, kept, strict=True):
        if len(after) != len(before):
            rewrite(path, after)


class CaptureStore:
    """The append-only capture folder of one server (see the module docstring)."""

    def __init__(
        self,
        settings: CaptureSettings,
        root: str | Path,
        *,
        secrets: Iterable[str] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        folder = Path(settings.path)
        self.folder = folder if folder.is_absolute() else Path(root) / folder
        self.current = self.folder / f"{REQUESTS_STEM}.jsonl"
        self._secrets = sorted({s for s in secrets if s and len(s) >= 8}, key=len, reverse=True)
        # the environment is read here: a key set for no worker is masked all the same
        self.masker = SecretMasker(self._secrets)
        self._clock = clock
        self._redact = load_redactor(settings.redact)
        self._thread_lock = threading.Lock()
        self._ids: set[str] = set()
        self._position: tuple[int, int] | None = None  # (inode, bytes read) of requests.jsonl
        self._file_lock: FileLock | None = None
        if settings.enabled:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._file_lock = FileLock(str(self.folder / ".requests.lock"))
            with self._locked():
                self._apply_retention()
                self._reload_ids()

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    @property
    def secrets(self) -> list[str]:
        """The configured values masked in every record (longest first); the masker also
        masks the environment's secrets, key shapes and random-looking tokens."""
        return list(self._secrets)

    def describe(self) -> dict[str, Any]:
        """For ``/ready`` or ``/v1/models``: whether questions are kept, where, how long."""
        s = self.settings
        return {
            "enabled": s.enabled,
            "path": s.path,
            "stores": ["question", "workflow", "answer", "cost", "tokens", "model version"]
            if s.enabled
            else [],
            "never_stores": ["headers", "api keys", "credentials", "environment"],
            "retention": {"max_age_days": s.max_age_days, "max_records": s.max_records},
            "rotation": {"max_file_bytes": s.max_file_bytes, "keep_files": s.keep_files},
            "feedback": {
                "accepted": s.enabled,
                "max_file_bytes": s.feedback.max_file_bytes,
                "keep_files": s.feedback.keep_files,
                "max_records": s.feedback.max_records,
            },
            "redaction": s.redact,
            "fsync": s.fsync,
        }

    def _locked(self) -> _BothLocks:
        assert self._file_lock is not None
        return _BothLocks(self._thread_lock, self._file_lock)

    def prepare(self, record: Mapping[str, Any]) -> dict[str, Any] | None:
        """The line's content: secrets masked, then the redaction hook (None: skip)."""
        data = masked(dict(record), self.masker)
        if self._redact is not None:
            redacted = self._redact(data)
            if redacted is None:
                return None
            if not isinstance(redacted, Mapping) or not redacted.get("request_id"):
                raise ValueError(
                    f"serving.capture.redact: {self.settings.redact} must return the record "
                    "(a mapping that keeps request_id) or None"
                )
            data = masked(dict(redacted), self.masker)
        return data

    def append(self, record: Mapping[str, Any]) -> bool:
        """Write one record (see :func:`capture_record`); False when capture is off or the
        redaction hook skipped it."""
        if not self.enabled:
            return False
        data = self.prepare(record)
        if data is None:
            return False
        line = (json.dumps(data, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        with self._locked():
            size = self.current.stat().st_size if self.current.exists() else 0
            if size and size + len(line) > self.settings.max_file_bytes:
                self._rotate()
                self._apply_retention()
                self._reload_ids()
            append_line(self.current, line, fsync=self.settings.fsync)
            self._ids.add(str(data["request_id"]))
        return True

    async def append_async(self, record: Mapping[str, Any]) -> bool:
        """:meth:`append` off the event loop (the fsync must not stall other requests)."""
        return await asyncio.to_thread(self.append, record)

    def contains(self, request_id: str) -> bool:
        """Whether a request with this id is in the store. A miss first reads what other
        server processes appended since the last look (the whole store only when a file was
        rotated or rewritten), so an unknown id costs no full re-read."""
        if not self.enabled:
            return False
        with self._thread_lock:
            if request_id in self._ids:
                return True
        with self._locked():
            self._catch_up()
            return request_id in self._ids

    def _catch_up(self) -> None:
        try:
            status = os.stat(self.current)
        except FileNotFoundError:
            if self._position is not None:
                self._reload_ids()
            return
        inode, offset = self._position or (None, 0)
        if status.st_ino != inode or status.st_size < offset:
            self._reload_ids()
            return
        with self.current.open("rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        for line in complete.decode("utf-8", errors="replace").splitlines():
            try:
                request_id = json.loads(line).get("request_id")
            except (ValueError, AttributeError):
                continue
            if request_id:
                self._ids.add(str(request_id))
        self._position = (inode, offset + len(complete))

    def records(self) -> list[dict[str, Any]]:
        """Every kept record, oldest first."""
        return read_records(self.folder, REQUESTS_STEM)[0]

    def _reload_ids(self) -> None:
        """Every id in the store, and where the current file was read up to (locks held)."""
        self._ids = {str(r.get("request_id")) for r in self.records() if r.get("request_id")}
        try:
            status = os.stat(self.current)
        except FileNotFoundError:
            self._position = None
            return
        with self.current.open("rb") as handle:
            data = handle.read()
        self._position = (status.st_ino, data.rfind(b"\n") + 1)

    def _rotate(self) -> None:
        rotate_files(self.folder, REQUESTS_STEM, self.settings.keep_files)

    def _apply_retention(self) -> None:
        s = self.settings
        cutoff = None if s.max_age_days is None else self._clock() - s.max_age_days * 86400
        apply_retention(self.folder, REQUESTS_STEM, cutoff, s.max_records)


class _BothLocks:
    """The thread lock, then the file lock: threads of this process, then other processes."""

    def __init__(self, thread_lock: threading.Lock, file_lock: FileLock) -> None:
        self.thread_lock, self.file_lock = thread_lock, file_lock

    def __enter__(self) -> None:
        self.thread_lock.acquire()
        try:
            self.file_lock.acquire()
        except BaseException:
            self.thread_lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.file_lock.release()
        finally:
            self.thread_lock.release()
