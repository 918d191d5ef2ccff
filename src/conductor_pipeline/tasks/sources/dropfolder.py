"""Sources that grow between scheduled runs, read from a watermark so that each run takes
only what is new: a local drop folder of JSONL files, and LiveCodeBench by ``contest_date``.

**Watermarks.** A watermark is a short string per source name, kept by a
:class:`WatermarkStore` (``read(source)``/``write(source, value)``). This package ships the
plain-file one (:class:`FileWatermarks`); the retraining pipeline backs the same interface
with MLflow (``conductor_pipeline.pipelines.retraining.watermarks``), since this package
imports neither Kedro nor MLflow. A collect function only *computes* the next watermark
(:attr:`Batch.watermark`); the caller writes it with :func:`commit` once the run that used
the batch has succeeded, so a failed run takes the same data again.

**Drop folder** (:func:`read_drop_folder`): every ``pattern`` file in the folder (sorted by
name), one task per line in the task format of logged questions (``question``, ``answer``,
``answer_format``, ``verifier``; optionally ``id``, ``domain``, ``difficulty``, ``source``,
``metadata``). The watermark is a position: for each file, the bytes already taken and a
digest of them. A run reads each file from there, up to its last complete line (a file
still being written is taken up to its last newline); a new file is read whole. A file whose
taken part changed (rewritten, not appended to) is read again from the start and reported
in ``summary.rewritten``. With ``date_field``, rows are also windowed by that field
(``start_date``/``end_date``, inclusive ISO dates); rows outside are counted and passed
over for good (the position moves past them, as past every line read).

**LiveCodeBench** (:func:`livecodebench_window`): rows of the hub schema (``contest_date``
on each), mapped by the benchmark's own ``livecodebench_task``. The watermark is the latest
``contest_date`` taken: a run takes problems from contests after it (within the optional
window). LiveCodeBench's releases add contests after the previous release's last date, which
is what makes a date a sound position for it.

``Batch.unchanged`` is true when nothing new was found: the run then trains on nothing new.
``conductor_pipeline.tasks.sources.growing`` reads every configured source at once.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from conductor_pipeline.hashing import content_hash
from conductor_pipeline.tasks.sources.benchmarks import livecodebench_task
from conductor_pipeline.tasks.types import Task

_DIGEST_CHARS = 16


class WatermarkStore(Protocol):
    """Where watermarks live between runs: one string per source name."""

    def read(self, source: str) -> str | None: ...

    def write(self, source: str, value: str) -> None: ...


class FileWatermarks:
    """Watermarks in one JSON file (``{source: value}``), replaced atomically on write."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _all(self) -> dict[str, str]:
        if not self.path.exists():
            return {}
        data = json.loads(self.path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"{self.path}: a watermark file holds a JSON object")
        return {str(k): str(v) for k, v in data.items()}

    def read(self, source: str) -> str | None:
        return self._all().get(source)

    def write(self, source: str, value: str) -> None:
        data = {**self._all(), source: value}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".watermarks-")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)


@dataclass
class Batch:
    """What one run takes from a source: new tasks, the watermark to store once the run has
    succeeded, and counts for the run's report."""

    source: str
    tasks: list[Task] = field(default_factory=list)
    previous: str | None = None
    watermark: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def unchanged(self) -> bool:
        """No new task: the run trains on nothing new from this source."""
        return not self.tasks

    @property
    def advanced(self) -> bool:
        """The watermark moves (new lines were read, even if none made a task)."""
        return self.watermark is not None and self.watermark != self.previous

    def report(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "tasks": len(self.tasks),
            "unchanged": self.unchanged,
            "previous_watermark": self.previous,
            "watermark": self.watermark,
            **self.summary,
        }


def commit(store: WatermarkStore, batch: Batch) -> bool:
    """Store the batch's watermark (after the run that used it succeeded); False when it
    did not move."""
    if not batch.advanced:
        return False
    store.write(batch.source, str(batch.watermark))
    return True


# ------------------------------------------------------------------------------ dates


def iso_date(value: Any) -> str | None:
    """``value`` (an ISO date or time string, or a date) as ``YYYY-MM-DDTHH:MM:SS`` (UTC when
    a zone is given), so that dates and times compare as strings; None if unreadable."""
    if isinstance(value, dt.datetime):
        parsed = value
    elif isinstance(value, dt.date):
        parsed = dt.datetime(value.year, value.month, value.day)
    elif isinstance(value, str) and value.strip():
        try:
            parsed = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
    else:
        return None
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(dt.UTC).replace(tzinfo=None)
    return parsed.strftime("%Y-%m-%dT%H:%M:%S")


def _bound(value: Any, name: str, *, end: bool = False) -> str | None:
    if value is None:
        return None
    text = iso_date(value)
    if text is None:
        raise ValueError(f"{name}: not an ISO date, got {value!r}")
    is_day = isinstance(value, dt.date) and not isinstance(value, dt.datetime)
    if end and (is_day or (isinstance(value, str) and len(value.strip()) == 10)):
        text = text[:10] + "T23:59:59"  # an end day is inclusive
    return text


def _in_window(date: str, start: str | None, end: str | None) -> bool:
    return (start is None or date >= start) and (end is None or date <= end)


# ------------------------------------------------------------------------------ drop folder


def _digest(data: bytes) -> str:
    return content_hash(data, length=_DIGEST_CHARS)


def _positions(watermark: str | None) -> dict[str, tuple[int, str]]:
    if not watermark:
        return {}
    try:
        data = json.loads(watermark)
        return {str(name): (int(pos[0]), str(pos[1])) for name, pos in data["files"].items()}
    except (ValueError, KeyError, TypeError, IndexError) as err:
        raise ValueError(f"drop folder: unreadable watermark {watermark[:80]!r}: {err}") from err


def row_task(row: Mapping[str, Any], defaults: Mapping[str, str]) -> Task | None:
    """The task of one drop-folder line; None when it has no reference answer (no reward
    can be computed). Raises ``ValueError``/``TypeError`` for a malformed line."""
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("no question")
    if not all(row.get(k) for k in ("answer", "answer_format", "verifier")):
        return None
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        raise TypeError("metadata must be an object")
    digest = content_hash(question.strip().encode())
    return Task(
        id=str(row.get("id") or f"{defaults['source']}/{digest}"),
        domain=str(row.get("domain") or defaults["domain"]),
        difficulty=str(row.get("difficulty") or defaults["difficulty"]),
        question=question,
        answer=str(row["answer"]),
        answer_format=str(row["answer_format"]),
        verifier=str(row["verifier"]),
        source=str(row.get("source") or defaults["source"]),
        metadata=dict(metadata),
    )


def _new_part(
    path: Path, taken: tuple[int, str] | None, summary: dict[str, Any]
) -> tuple[bytes, int, int]:
    """The file's bytes (read once), where this run starts and where its last complete line
    ends: a file read before continues after its taken part unless that part changed."""
    data = path.read_bytes()
    start = 0
    if taken is not None:
        offset, digest = taken
        if offset <= len(data) and _digest(data[:offset]) == digest:
            start = offset
        else:
            summary["rewritten"].append(path.name)
    return data, start, max(data.rfind(b"\n") + 1, start)


def read_drop_folder(
    folder: str | Path,
    watermark: str | None = None,
    *,
    pattern: str = "*.jsonl",
    source: str = "drop_folder",
    domain: str = "drop",
    difficulty: str = "medium",
    date_field: str | None = None,
    start_date: Any = None,
    end_date: Any = None,
) -> Batch:
    """The new lines of the drop folder since ``watermark`` as tasks (module docstring)."""
    folder = Path(folder)
    start, end = _bound(start_date, "start_date"), _bound(end_date, "end_date", end=True)
    positions = _positions(watermark)
    summary: dict[str, Any] = {
        "files": 0,
        "new_lines": 0,
        "without_reference": 0,
        "outside_window": 0,
        "invalid": [],
        "rewritten": [],
    }
    batch = Batch(source=source, previous=watermark, summary=summary)
    defaults = {"domain": domain, "difficulty": difficulty, "source": source}
    window = (date_field, start, end)
    files = sorted(p for p in folder.glob(pattern) if p.is_file()) if folder.is_dir() else []
    summary["files"] = len(files)
    seen_ids: set[str] = set()
    taken: dict[str, tuple[int, str]] = {}  # files no longer in the folder are forgotten
    for path in files:
        data, begin, stop = _new_part(path, positions.get(path.name), summary)
        first = data[:begin].count(b"\n")
        lines = data[begin:stop].decode("utf-8", errors="replace").splitlines()
        for number, line in enumerate(lines, start=first + 1):
            if not line.strip():
                continue
            summary["new_lines"] += 1
            task = _line_task(line, f"{path.name}:{number}", defaults, window, summary)
            if task is None:
                continue
            if task.id in seen_ids:
                summary["invalid"].append(f"{path.name}:{number}: repeats id {task.id!r}")
                continue
            seen_ids.add(task.id)
            batch.tasks.append(task)
        taken[path.name] = (stop, _digest(data[:stop]))
    if taken:
        files_json = {name: list(pos) for name, pos in sorted(taken.items())}
        batch.watermark = json.dumps({"files": files_json}, separators=(",", ":"))
    return batch


def _line_task(
    line: str,
    where: str,
    defaults: Mapping[str, str],
    window: tuple[str | None, str | None, str | None],
    summary: dict[str, Any],
) -> Task | None:
    date_field, start, end = window
    try:
        row = json.loads(line)
    except ValueError as err:
        summary["invalid"].append(f"{where}: not JSON ({err.msg})")
        return None
    if not isinstance(row, dict):
        summary["invalid"].append(f"{where}: not a JSON object")
        return None
    if date_field is not None:
        date = iso_date(row.get(date_field))
        if date is None:
            summary["invalid"].append(f"{where}: no readable {date_field!r}")
            return None
        if not _in_window(date, start, end):
            summary["outside_window"] += 1
            return None
    try:
        task = row_task(row, defaults)
    except (ValueError, TypeError) as err:
        summary["invalid"].append(f"{where}: {err}")
        return None
    if task is None:
        summary["without_reference"] += 1
    return task


# ------------------------------------------------------------------------------ LiveCodeBench


def livecodebench_window(
    rows: Iterable[Mapping[str, Any]],
    watermark: str | None = None,
    *,
    start_date: Any = None,
    end_date: Any = None,
    include_functional: bool = True,
    private_tests: bool = True,
    source: str = "livecodebench",
) -> Batch:
    """LiveCodeBench problems from contests after ``watermark`` (a ``contest_date``) and
    within ``start_date``..``end_date`` (inclusive), in contest order; the new watermark is
    the latest contest date looked at."""
    since = _bound(watermark, "watermark") if watermark else None
    start, end = _bound(start_date, "start_date"), _bound(end_date, "end_date", end=True)
    summary: dict[str, Any] = {
        "rows": 0,
        "older_than_watermark": 0,
        "outside_window": 0,
        "no_contest_date": 0,
        "without_tests": 0,
    }
    batch = Batch(source=source, previous=watermark, watermark=watermark, summary=summary)
    dated: list[tuple[str, int, Mapping[str, Any]]] = []
    for index, row in enumerate(rows):
        summary["rows"] += 1
        date = iso_date(row.get("contest_date"))
        if date is None:
            summary["no_contest_date"] += 1
        elif since is not None and date <= since:
            summary["older_than_watermark"] += 1
        elif not _in_window(date, start, end):
            summary["outside_window"] += 1
        else:
            dated.append((date, index, row))
    for date, index, row in sorted(dated, key=lambda item: (item[0], item[1])):
        task = livecodebench_task(
            row, index=index, include_functional=include_functional, private_tests=private_tests
        )
        if task is None:
            summary["without_tests"] += 1
        else:
            batch.tasks.append(task)
        batch.watermark = date
    return batch
