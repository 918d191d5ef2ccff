"""Feedback on served answers: the ``POST /v1/feedback`` body and its append-only store.

A body names the ``request_id`` of an earlier completion (the ``id`` of the response, also
``conductor.request_id``) and exactly one of:

- ``reference_answer``: the right answer, optionally with ``answer_format`` (number, math,
  letter, text) and ``verifier`` (math, numeric, exact, multiple_choice). Without them a
  plain number is checked numerically and anything else by exact text match. Such a request
  becomes a training task (``conductor_pipeline.tasks.sources.traffic``);
- ``verdict``: ``right`` or ``wrong``; the request joins the evaluation slice (a ``right``
  one with the served answer as the accepted answer);
- ``score``: a number from 0 to 1; evaluation slice.

Optional ``comment`` (at most 2000 characters) is stored with it. Credentials are masked in
what is stored, as in captured records (``serving.redaction``); a reference answer that
would lose text to the masking is refused (400): it could only train on ``***``. Unknown
fields, wrong types (nothing is coerced: ``"0.5"`` is not a score) and non-finite numbers
are refused with a 400 whose ``param`` names the field.

Rules (:meth:`FeedbackStore.submit`):

- **capture off**: feedback is refused with a 404 (``capture_off``) and nothing is written:
  without captured requests it could never be joined, and the server would keep whatever
  anyone sends;
- **unknown request**: a ``request_id`` the capture store does not hold is a 404
  (``unknown_request_id``): feedback that could never be joined is refused, not kept;
- **idempotent**: the same body again for the same id answers 200 with the stored record and
  ``"duplicate": true``; a different body for an id that already has feedback is a 409
  (``feedback_conflict``): the store is append-only and the first word stands (within what
  retention keeps);
- **bounded**: records go to ``feedback.jsonl`` in the capture folder, one line each, under
  the same locking and fsync rule as the capture store. Past
  ``serving.capture.feedback.max_file_bytes`` the file rotates (``feedback.1.jsonl`` the
  newest rotated file, ``keep_files`` kept); at start-up and at each rotation capture's
  ``max_age_days`` and ``feedback.max_records`` apply. The store keeps in memory one digest
  per kept request id, not the records.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from conductor_pipeline.config_checks import unknown_keys_message
from conductor_pipeline.serving.capture import (
    CaptureSettings,
    CaptureStore,
    _BothLocks,
    append_line,
    apply_retention,
    masked,
    rotate_files,
    utc_now,
)
from conductor_pipeline.serving.errors import ApiError
from conductor_pipeline.serving.redaction import SecretMasker
from conductor_pipeline.tasks.sources.traffic import (
    FEEDBACK_STEM,
    read_jsonl,
    read_records,
    reference_verifier,
    rotated_files,
)

_CHOICES = ("reference_answer", "verdict", "score")
_MAX_ANSWER_CHARS = 20_000
_FIELD_PREFIX = re.compile(r"^(request_id|reference_answer|answer_format|verifier|verdict|score): ")
_CONTENT_FIELDS = ("reference_answer", "answer_format", "verifier", "verdict", "score", "comment")


class Feedback(BaseModel):
    """One ``POST /v1/feedback`` body."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    request_id: str = Field(min_length=1, max_length=200)
    reference_answer: str | None = Field(default=None, min_length=1, max_length=_MAX_ANSWER_CHARS)
    answer_format: Literal["number", "math", "letter", "text"] | None = None
    verifier: Literal["math", "numeric", "exact", "multiple_choice"] | None = None
    verdict: Literal["right", "wrong"] | None = None
    score: float | None = Field(default=None, ge=0.0, le=1.0)
    comment: str | None = Field(default=None, max_length=2000)

    @field_validator("request_id")
    @classmethod
    def _printable(cls, value: str) -> str:
        if not value.isprintable() or value != value.strip():
            raise ValueError("must be printable text without surrounding spaces")
        return value

    @field_validator("score", mode="before")
    @classmethod
    def _finite(cls, value: Any) -> Any:
        # strict floats still take ints (0, 1); refuse bools and NaN/inf with their own words
        if isinstance(value, bool):
            raise ValueError("must be a number from 0 to 1, not a boolean")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("must be a finite number from 0 to 1")
        return float(value) if isinstance(value, int) else value

    @model_validator(mode="after")
    def _exactly_one(self) -> Feedback:
        given = [name for name in _CHOICES if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of {', '.join(_CHOICES)}"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if self.reference_answer is None and (self.answer_format or self.verifier):
            name = "answer_format" if self.answer_format else "verifier"
            raise ValueError(f"{name}: goes with reference_answer only")
        if self.reference_answer is not None and not self.reference_answer.strip():
            raise ValueError("reference_answer: must not be blank")
        return self

    def content(self) -> dict[str, Any]:
        """What the idempotency check compares: the body without its id, defaults filled."""
        data = {k: getattr(self, k) for k in _CONTENT_FIELDS}
        if self.reference_answer is not None:
            fmt, verifier = reference_verifier(
                self.reference_answer, self.answer_format, self.verifier
            )
            data["answer_format"], data["verifier"] = fmt, verifier
        return data


def parse_feedback(body: Any) -> Feedback:
    """The validated body; ``ApiError(400)`` whose ``param`` names the first bad field."""
    if not isinstance(body, Mapping):
        raise ApiError(400, "the body must be a JSON object", code="invalid_body")
    try:
        return Feedback.model_validate(dict(body))
    except ValidationError as err:
        first = err.errors()[0]
        location = ".".join(str(part) for part in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        named = _FIELD_PREFIX.match(message)
        if not location and named:  # a rule over several fields names the one at fault
            location, message = named[1], message[named.end() :]
        where = f"{location}: " if location else ""
        if first["type"] == "extra_forbidden":  # the shared message names the field itself
            where, message = "", unknown_keys_message("feedback", [location], Feedback.model_fields)
        raise ApiError(
            400, f"{where}{message}", param=location or None, code="invalid_feedback"
        ) from None


class FeedbackStore:
    """``feedback.jsonl`` next to the capture store (see the module docstring)."""

    def __init__(
        self,
        capture: CaptureStore | None,
        folder: str | Path | None = None,
        *,
        fsync: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if folder is None and capture is None:
            raise ValueError("FeedbackStore: give the capture store or a folder")
        self.capture = capture
        self.folder = Path(folder) if folder is not None else capture.folder  # type: ignore[union-attr]
        self.path = self.folder / f"{FEEDBACK_STEM}.jsonl"
        settings = capture.settings if capture is not None else CaptureSettings()
        self.limits = settings.feedback
        self.fsync = settings.fsync if capture is not None else fsync
        self.masker = capture.masker if capture is not None else SecretMasker()
        self._max_age_days = settings.max_age_days if capture is not None else None
        self._clock = clock
        # request id -> (content digest, time, kind): what idempotency needs, not the record
        self._index: dict[str, tuple[str, Any, str]] = {}
        self._position: tuple[int, int] | None = None  # (inode, bytes read) of feedback.jsonl
        self._locks: _BothLocks | None = None
        if self.accepting:  # capture off: no folder, no file
            self.folder.mkdir(parents=True, exist_ok=True)
            self._locks = _BothLocks(
                threading.Lock(), FileLock(str(self.folder / ".feedback.lock"))
            )
            with self._locks:
                self._apply_retention()
                self._reload()

    @property
    def accepting(self) -> bool:
        """Feedback is taken only while capture is on: without a captured request it could
        never be joined, and an unjoinable store would be disk anyone may fill."""
        return self.capture is not None and self.capture.enabled

    def __len__(self) -> int:
        """The number of request ids the in-memory index holds."""
        return len(self._index)

    def _apply_retention(self) -> None:
        """Capture's ``max_age_days`` and ``feedback.max_records`` (locks held)."""
        cutoff = None
        if self._max_age_days is not None:
            cutoff = self._clock() - self._max_age_days * 86400
        apply_retention(self.folder, FEEDBACK_STEM, cutoff, self.limits.max_records)

    def _reload(self) -> None:
        """The index from every kept file, and where the current one was read up to."""
        self._index.clear()
        self._position = None
        for path in rotated_files(self.folder, FEEDBACK_STEM):
            if path != self.path:
                for record in read_jsonl(path)[0]:
                    self._remember(record)
        self._catch_up()

    def _remember(self, record: Mapping[str, Any]) -> None:
        request_id = record.get("request_id")
        if isinstance(request_id, str) and request_id not in self._index:
            kind = next((k for k in _CHOICES if record.get(k) is not None), "")
            self._index[request_id] = (_digest(record), record.get("time"), kind)

    def _catch_up(self) -> None:
        """Read what was appended since the last look (other processes write here too); a
        file rotated or rewritten by another process is read again whole."""
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            if self._position is not None:
                self._reload()
            return
        inode, offset = self._position or (status.st_ino, 0)
        if status.st_ino != inode or status.st_size < offset:
            self._reload()
            return
        if status.st_size == offset:
            self._position = (inode, offset)
            return
        with self.path.open("rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits
        for line in complete.decode("utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                self._remember(record)
        self._position = (inode, offset + len(complete))

    def submit(self, feedback: Feedback) -> tuple[int, dict[str, Any]]:
        """Store ``feedback``; returns ``(status, reply body)`` or raises ``ApiError``."""
        if not self.accepting:
            raise ApiError(
                404,
                f"request_id: capture is off on this server, so no request "
                f"{feedback.request_id!r} can be joined and feedback is not kept (turn on "
                "serving.capture.enabled to collect feedback)",
                param="request_id",
                code="capture_off",
            )
        if not self.capture.contains(feedback.request_id):  # type: ignore[union-attr]
            raise ApiError(
                404,
                f"request_id: no captured request {feedback.request_id!r} (capture keeps "
                "requests answered since it was turned on, within its retention)",
                param="request_id",
                code="unknown_request_id",
            )
        # credentials are masked as in captured records (a comment may quote one)
        content = masked(feedback.content(), self.masker)
        if content["reference_answer"] != feedback.reference_answer:
            raise ApiError(
                400,
                "reference_answer: looks like (or contains) a credential, which is never "
                "stored; send the answer without it",
                param="reference_answer",
                code="credential_in_reference",
            )
        assert self._locks is not None
        with self._locks:
            self._catch_up()
            earlier = self._index.get(feedback.request_id)
            if earlier is not None:
                digest, received, kind = earlier
                if digest != _digest(content):
                    raise ApiError(
                        409,
                        f"request_id: {feedback.request_id!r} already has different feedback "
                        f"(received {received}); the first one stands",
                        param="request_id",
                        code="feedback_conflict",
                    )
                return 200, _reply(feedback.request_id, received, kind, duplicate=True)
            record = {"request_id": feedback.request_id, "time": utc_now(self._clock), **content}
            self._append(record)
        return 200, _reply(record["request_id"], record["time"], _kind(record), duplicate=False)

    async def submit_async(self, feedback: Feedback) -> tuple[int, dict[str, Any]]:
        return await asyncio.to_thread(self.submit, feedback)

    def _append(self, record: dict[str, Any]) -> None:
        """One line; past ``max_file_bytes`` the file rotates first (locks held)."""
        line = (json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        size = self.path.stat().st_size if self.path.exists() else 0
        if size and size + len(line) > self.limits.max_file_bytes:
            rotate_files(self.folder, FEEDBACK_STEM, self.limits.keep_files)
            self._apply_retention()
            self._reload()
        append_line(self.path, line, fsync=self.fsync)
        # everything before was read by _catch_up under the same lock
        self._remember(record)
        status = os.stat(self.path)
        self._position = (status.st_ino, status.st_size)

    def records(self) -> list[dict[str, Any]]:
        """Every kept feedback record (rotated files too), in arrival order."""
        return read_records(self.folder, FEEDBACK_STEM)[0]


def _kind(record: Mapping[str, Any]) -> str:
    return next(k for k in _CHOICES if record.get(k) is not None)


def _digest(record: Mapping[str, Any]) -> str:
    """What the idempotency check compares: the content fields, hashed."""
    content = {k: record.get(k) for k in _CONTENT_FIELDS}
    text = json.dumps(content, sort_keys=True, ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _reply(request_id: str, received: Any, kind: str, *, duplicate: bool) -> dict[str, Any]:
    return {
        "object": "feedback",
        "request_id": request_id,
        "received": received,
        "kind": kind,
        "duplicate": duplicate,
        "joinable": True,
    }


def open_stores(
    settings: CaptureSettings, root: str | Path, *, secrets: Iterable[str] = ()
) -> tuple[CaptureStore, FeedbackStore]:
    """A server's capture store (``serving.capture``; off: it writes nothing) and the
    feedback store next to it, with the secret values both mask."""
    capture = CaptureStore(settings, root, secrets=secrets)
    return capture, FeedbackStore(capture)
