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

Optional ``comment`` (at most 2000 characters) is stored with it; known secret values are
masked in what is stored, as in captured records. Unknown fields, wrong
types (nothing is coerced: ``"0.5"`` is not a score) and non-finite numbers are refused with
a 400 whose ``param`` names the field.

Rules (:meth:`FeedbackStore.submit`):

- **unknown request**: with capture on, a ``request_id`` the capture store does not hold is
  a 404 (``unknown_request_id``): feedback that could never be joined is refused, not kept.
  With capture off the server has no record of its requests, so the feedback is stored
  (200) with ``"joinable": false`` in the reply: it will be used only if a capture folder
  that holds the request is joined with it later;
- **idempotent**: the same body again for the same id answers 200 with the stored record and
  ``"duplicate": true``; a different body for an id that already has feedback is a 409
  (``feedback_conflict``): the store is append-only and the first word stands;
- records go to ``feedback.jsonl`` in the capture folder, one line each, under the same
  locking and fsync rule as the capture store; capture's ``max_age_days`` applies to them at
  start-up (the file is not rotated: a line is a few hundred bytes).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from conductor_pipeline.serving.capture import (
    CaptureSettings,
    CaptureStore,
    _BothLocks,
    _plain,
    append_line,
    parse_time,
    rewrite,
    utc_now,
)
from conductor_pipeline.serving.errors import ApiError
from conductor_pipeline.tasks.sources.traffic import (
    FEEDBACK_STEM,
    FEEDBACK_VERIFIERS,
    read_jsonl,
    reference_verifier,
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
        if first["type"] == "extra_forbidden":
            message = (
                f"unknown field; accepted: request_id, {', '.join(_CHOICES)}, answer_format, "
                f"verifier ({', '.join(FEEDBACK_VERIFIERS)}), comment"
            )
        where = f"{location}: " if location else ""
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
        self.fsync = capture.settings.fsync if capture is not None else fsync
        self._clock = clock
        self.folder.mkdir(parents=True, exist_ok=True)
        self._locks = _BothLocks(threading.Lock(), FileLock(str(self.folder / ".feedback.lock")))
        self._stored: dict[str, dict[str, Any]] = {}
        self._offset = 0
        max_age = capture.settings.max_age_days if capture is not None else None
        if max_age is not None:
            with self._locks:
                self._drop_older_than(clock() - max_age * 86400)

    def _drop_older_than(self, cutoff: float) -> None:
        """Capture's retention applies to feedback too (at start-up; feedback is small)."""
        if not self.path.exists():
            return
        records = read_jsonl(self.path)[0]
        kept = [r for r in records if (parse_time(r.get("time")) or 0) >= cutoff]
        if len(kept) != len(records):
            rewrite(self.path, kept)

    def _catch_up(self) -> None:
        """Read what was appended since the last look (other processes write here too)."""
        if not self.path.exists():
            return
        size = self.path.stat().st_size
        if size < self._offset:  # the file was replaced (retention): read it again
            self._stored.clear()
            self._offset = 0
        if size == self._offset:
            return
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits
        for line in complete.decode("utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("request_id"), str):
                self._stored.setdefault(record["request_id"], record)
        self._offset += len(complete)

    def submit(self, feedback: Feedback) -> tuple[int, dict[str, Any]]:
        """Store ``feedback``; returns ``(status, reply body)`` or raises ``ApiError``."""
        capture_on = self.capture is not None and self.capture.enabled
        if capture_on and not self.capture.contains(feedback.request_id):  # type: ignore[union-attr]
            raise ApiError(
                404,
                f"request_id: no captured request {feedback.request_id!r} (capture keeps "
                "requests answered since it was turned on, within its retention)",
                param="request_id",
                code="unknown_request_id",
            )
        # known secrets are masked as in captured records (a comment may quote one)
        content = _plain(feedback.content(), self.capture.secrets if self.capture else [])
        with self._locks:
            self._catch_up()
            earlier = self._stored.get(feedback.request_id)
            if earlier is not None:
                if {k: earlier.get(k) for k in _CONTENT_FIELDS} != content:
                    raise ApiError(
                        409,
                        f"request_id: {feedback.request_id!r} already has different feedback "
                        "(received " + str(earlier.get("time")) + "); the first one stands",
                        param="request_id",
                        code="feedback_conflict",
                    )
                return 200, self._reply(earlier, duplicate=True, joinable=capture_on)
            record = {"request_id": feedback.request_id, "time": utc_now(self._clock), **content}
            self._append(record)
            self._stored[feedback.request_id] = record
        return 200, self._reply(record, duplicate=False, joinable=capture_on)

    async def submit_async(self, feedback: Feedback) -> tuple[int, dict[str, Any]]:
        return await asyncio.to_thread(self.submit, feedback)

    def _append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        append_line(self.path, line, fsync=self.fsync)
        # everything before was read by _catch_up under the same lock
        self._offset = self.path.stat().st_size

    @staticmethod
    def _reply(record: dict[str, Any], *, duplicate: bool, joinable: bool) -> dict[str, Any]:
        return {
            "object": "feedback",
            "request_id": record["request_id"],
            "received": record.get("time"),
            "kind": next(k for k in _CHOICES if record.get(k) is not None),
            "duplicate": duplicate,
            "joinable": joinable,
            **({} if joinable else {"note": "capture is off: this feedback cannot be joined"}),
        }

    def records(self) -> list[dict[str, Any]]:
        """Every stored feedback record, in arrival order."""
        return read_jsonl(self.path)[0] if self.path.exists() else []


def open_stores(
    settings: CaptureSettings, root: str | Path, *, secrets: Iterable[str] = ()
) -> tuple[CaptureStore, FeedbackStore]:
    """A server's capture store (``serving.capture``; off: it writes nothing) and the
    feedback store next to it, with the secret values both mask."""
    capture = CaptureStore(settings, root, secrets=secrets)
    return capture, FeedbackStore(capture)
