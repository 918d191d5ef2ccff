"""Served traffic as a task source: captured requests joined with the feedback they received.

The Conductor API, with ``serving.capture`` on, appends one record per served request to
``requests.jsonl`` (rotated to ``requests.1.jsonl``, ``requests.2.jsonl``, ...; the higher
the number, the older) and every accepted ``POST /v1/feedback`` body to ``feedback.jsonl``,
both in the capture folder (``conductor_pipeline.serving.capture`` and ``.feedback`` write
them). This module reads those files and turns them into:

- **training tasks**: requests that received a reference answer. Each becomes a
  :class:`Task` in the project's format (id ``traffic/<request_id>``, the composed question,
  the reference, its answer format and verifier), so the reward is verifiable as for every
  other source;
- **an evaluation slice**: requests that received only a verdict (``right``/``wrong``) or a
  score. A ``right`` verdict makes the served answer the accepted one, so such a row also
  carries a task whose reference is that answer's stated final answer (boxed, after an
  "Answer:" marker, else its last line; reward by answer matching); ``wrong``
  verdicts and scores are kept as figures about the served version.

A question is the one asked (:func:`asked_question`: the earlier turns and system message
the API writes above it are left out) in its normalised form (:func:`question_key`). A
question that is, or is near, one of an evaluation split (validation or test;
``tasks.contamination``: disguises such as zero-width characters or lookalike letters do not
hide it) is dropped from both: training on it would leak the anchor into training, and
keeping it in the slice would measure the anchor twice (``summary.in_test_split``). A repeated question is kept once: the first
feedback on it (by feedback time), also across runs (feedback older than ``since`` still
marks its question as taken). A question that received different reference answers in one
read gives no training task at all (``summary.conflicting_reference`` counts the records
dropped, ``conflicting_questions`` the questions). Each task keeps its
provenance (``metadata.request_id``, capture and feedback times, the model version that
served it). The output order is deterministic: by feedback time, then request id.

``since`` (an ISO time) keeps only feedback received after it; the result's ``watermark`` is
the latest feedback time taken, so a scheduled run can take only what is new.

This package imports neither Kedro nor MLflow; the reader below is also the one the
capture store uses for its own files, so the format has one reader.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor_pipeline.tasks.answer_extraction import extract_final_answer
from conductor_pipeline.tasks.contamination import (
    DEFAULT_SIMILARITY_THRESHOLD,
    EvaluationIndex,
    evaluation_index,
)
from conductor_pipeline.tasks.sources._common import looks_numeric
from conductor_pipeline.tasks.splits import normalise_question
from conductor_pipeline.tasks.types import ANSWER_FORMATS, VERIFIERS, Task

REQUESTS_STEM = "requests"
FEEDBACK_STEM = "feedback"
# Verifiers a reference sent as feedback can use: the others need metadata a feedback body
# cannot carry (tests for ``code``, the dataset entry for ``reasoning_gym``).
FEEDBACK_VERIFIERS = ("math", "numeric", "exact", "multiple_choice")
# The verifier an answer format implies when feedback names none.
VERIFIER_FOR_FORMAT = {
    "number": "numeric",
    "math": "math",
    "letter": "multiple_choice",
    "text": "exact",
}
_ROTATED = re.compile(r"^(?P<stem>[A-Za-z0-9_-]+)\.(?P<n>\d+)\.jsonl$")
# How the API writes a question with earlier turns (``serving.schema.compose_question``):
# the opening, the transcript, then the marker and the question asked.
CONTEXT_OPENING = "Earlier turns of this conversation, for context:\n"
QUESTION_MARKER = "\n\nThe question to answer now:\n"


def asked_question(question: str) -> str:
    """The question a captured request asked, without the earlier turns the API put above
    it: the same question behind any context is one question."""
    if question.startswith(CONTEXT_OPENING) and QUESTION_MARKER in question:
        # the transcript has no blank line (each turn is one folded line): the first marker
        # ends it, whatever the question itself holds
        return question.split(QUESTION_MARKER, 1)[1]
    return question


def question_key(question: str) -> str:
    """The key "one task per question" is counted by: the asked question, normalised."""
    return normalise_question(asked_question(question))


def rotated_files(folder: str | Path, stem: str) -> list[Path]:
    """``<stem>.jsonl`` and its rotated copies in ``folder``, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    numbered = []
    for path in folder.iterdir():
        match = _ROTATED.match(path.name)
        if match and match["stem"] == stem and path.is_file():
            numbered.append((int(match["n"]), path))
    files = [path for _, path in sorted(numbered, reverse=True)]
    current = folder / f"{stem}.jsonl"
    if current.is_file():
        files.append(current)
    return files


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of one file and the number of lines that were not one.

    A line cut short (a crash in the middle of an append) is skipped and counted rather
    than failing the whole read.
    """
    records: list[dict[str, Any]] = []
    bad = 0
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(value, dict):
                records.append(value)
            else:
                bad += 1
    return records, bad


def read_records(folder: str | Path, stem: str) -> tuple[list[dict[str, Any]], int]:
    """Every record of ``<stem>.jsonl`` and its rotated copies, oldest first, and the number
    of unreadable lines."""
    records: list[dict[str, Any]] = []
    bad = 0
    for path in rotated_files(folder, stem):
        found, skipped = read_jsonl(path)
        records.extend(found)
        bad += skipped
    return records, bad


def reference_verifier(
    answer: str, answer_format: str | None, verifier: str | None
) -> tuple[str, str]:
    """The ``(answer_format, verifier)`` pair for a reference answer: what was given, else
    implied (a plain number is ``number``/``numeric``, anything else ``text``/``exact``).
    Raises ``ValueError`` naming the field for an unknown or unusable value."""
    if answer_format is not None and answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format: must be one of {ANSWER_FORMATS}, got {answer_format!r}")
    if verifier is not None and verifier not in FEEDBACK_VERIFIERS:
        known = "a known verifier" if verifier in VERIFIERS else "not a verifier"
        raise ValueError(
            f"verifier: must be one of {FEEDBACK_VERIFIERS} ({verifier!r} is {known}, "
            "but it needs task metadata a feedback body cannot carry)"
        )
    if answer_format == "code":
        raise ValueError("answer_format: 'code' needs tests, which a feedback body cannot carry")
    fmt = answer_format or ("number" if looks_numeric(answer) else "text")
    return fmt, verifier or VERIFIER_FOR_FORMAT[fmt]


@dataclass
class TrafficTasks:
    """What a read of the capture folder gives: training tasks, the evaluation slice, the
    latest feedback time taken (``watermark``) and counts for a report."""

    train: list[Task] = field(default_factory=list)
    evaluation: list[dict[str, Any]] = field(default_factory=list)
    watermark: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def unchanged(self) -> bool:
        """Nothing new: no training task and no evaluation row."""
        return not self.train and not self.evaluation


def _provenance(captured: Mapping[str, Any], feedback: Mapping[str, Any]) -> dict[str, Any]:
    model = captured.get("model") if isinstance(captured.get("model"), Mapping) else {}
    return {
        "request_id": str(captured["request_id"]),
        "captured_at": captured.get("time"),
        "feedback_at": feedback.get("time"),
        "model_version": model.get("id"),
        "served_answer": captured.get("answer"),
    }


def _task(
    request_id: str,
    question: str,
    answer: str,
    answer_format: str | None,
    verifier: str | None,
    metadata: dict[str, Any],
    defaults: Mapping[str, str],
) -> Task:
    fmt, checker = reference_verifier(answer, answer_format, verifier)
    return Task(
        id=f"traffic/{request_id}",
        domain=defaults["domain"],
        difficulty=defaults["difficulty"],
        question=question,
        answer=answer,
        answer_format=fmt,
        verifier=checker,
        source="traffic",
        metadata=metadata,
    )


def _split_feedback(
    feedback: Iterable[Mapping[str, Any]], since: str | None, summary: dict[str, Any]
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """One feedback record per request id (the first: the store refuses a different second
    one), as ``(newer than since, the rest)``, each ordered by time then request id."""
    first: dict[str, Mapping[str, Any]] = {}
    for record in feedback:
        request_id = record.get("request_id")
        if not isinstance(request_id, str) or not request_id:
            summary["invalid"] += 1
            continue
        first.setdefault(request_id, record)
    ordered = sorted(first.values(), key=lambda r: (str(r.get("time") or ""), r["request_id"]))
    taken = [r for r in ordered if since is None or str(r.get("time") or "") > since]
    older = [r for r in ordered if not (since is None or str(r.get("time") or "") > since)]
    summary["older_than_watermark"] = len(older)
    return taken, older


def traffic_tasks(
    captured: Iterable[Mapping[str, Any]],
    feedback: Iterable[Mapping[str, Any]],
    test_questions: EvaluationIndex | Mapping[str, Iterable[str]] | Iterable[str],
    *,
    since: str | None = None,
    domain: str = "traffic",
    difficulty: str = "medium",
    similarity_threshold: float = DEFAULT_SIMILARITY_THRESHOLD,
) -> TrafficTasks:
    """Join captured requests with their feedback (see the module docstring).

    ``test_questions`` are the evaluation questions no task may be: an
    :class:`EvaluationIndex`, questions by split, or the test split's questions (raw text;
    normalised here; ``similarity_threshold`` for the last two). Records without a request id, feedback for a request that was not captured, and
    references no verifier can use are counted in ``summary``, never raised.
    """
    summary: dict[str, Any] = {
        "captured": 0,
        "feedback": 0,
        "invalid": 0,
        "not_captured": 0,
        "in_test_split": 0,
        "repeated_question": 0,
        "conflicting_reference": 0,
        "conflicting_questions": 0,
        "unusable_reference": [],
        "train": 0,
        "evaluation": 0,
    }
    by_id: dict[str, Mapping[str, Any]] = {}
    for record in captured:
        request_id = record.get("request_id")
        question = record.get("question")
        if not isinstance(request_id, str) or not isinstance(question, str) or not question.strip():
            summary["invalid"] += 1
            continue
        summary["captured"] += 1
        by_id.setdefault(request_id, record)
    held_out = evaluation_index(test_questions, threshold=similarity_threshold)
    seen: set[str] = set()
    defaults = {"domain": domain, "difficulty": difficulty}
    out = TrafficTasks(summary=summary)
    rows, older = _split_feedback(feedback, since, summary)
    # questions an earlier run already took are not taken again under a new request id
    seen.update(
        question_key(str(by_id[r["request_id"]]["question"]))
        for r in older
        if r["request_id"] in by_id
    )
    summary["feedback"] = len(rows)
    conflicted = _conflicting_questions(rows, by_id)
    summary["conflicting_questions"] = len(conflicted)
    # every record looked at moves the watermark, used or not: a skipped one stays skipped
    times = [str(r.get("time") or "") for r in rows]
    out.watermark = max(times) if any(times) else None
    for record in rows:
        request_id = str(record["request_id"])
        captured_record = by_id.get(request_id)
        if captured_record is None:
            summary["not_captured"] += 1
            continue
        question = str(captured_record["question"])
        key = question_key(question)
        if asked_question(question) in held_out or question in held_out:
            summary["in_test_split"] += 1
            continue
        if key in conflicted and _reference(record) is not None:
            summary["conflicting_reference"] += 1
            continue
        if key in seen:
            summary["repeated_question"] += 1
            continue
        metadata = _provenance(captured_record, record)
        try:
            _add_row(out, record, request_id, question, metadata, defaults)
        except ValueError as err:
            summary["unusable_reference"].append(f"{request_id}: {err}")
            continue
        seen.add(key)
    summary["train"], summary["evaluation"] = len(out.train), len(out.evaluation)
    return out


def _reference(record: Mapping[str, Any]) -> str | None:
    """A feedback record's reference answer in a form two equal answers share (a number's
    value, text without case or spacing differences); None without a usable one."""
    reference = record.get("reference_answer")
    if not isinstance(reference, str) or not reference.strip():
        return None
    text = " ".join(reference.split())
    if looks_numeric(text):
        try:
            return repr(float(text.replace(",", "")))
        except ValueError:
            pass
    return text.casefold()


def _conflicting_questions(
    rows: Iterable[Mapping[str, Any]], by_id: Mapping[str, Mapping[str, Any]]
) -> set[str]:
    """The questions (:func:`question_key`) that received different reference answers: no
    one of them can be trusted, so none becomes a task."""
    references: dict[str, set[str]] = {}
    for record in rows:
        captured = by_id.get(str(record["request_id"]))
        reference = _reference(record)
        if captured is not None and reference is not None:
            key = question_key(str(captured["question"]))
            references.setdefault(key, set()).add(reference)
    return {key for key, found in references.items() if len(found) > 1}


def _add_row(
    out: TrafficTasks,
    record: Mapping[str, Any],
    request_id: str,
    question: str,
    metadata: dict[str, Any],
    defaults: Mapping[str, str],
) -> None:
    """A reference makes a training task; a verdict or score an evaluation row."""
    reference = record.get("reference_answer")
    if isinstance(reference, str) and reference.strip():
        out.train.append(
            _task(
                request_id,
                question,
                reference,
                record.get("answer_format"),
                record.get("verifier"),
                metadata,
                defaults,
            )
        )
        return
    verdict, score = record.get("verdict"), record.get("score")
    if verdict not in ("right", "wrong") and not isinstance(score, int | float):
        raise ValueError("no reference answer, verdict or score")
    row: dict[str, Any] = {
        "request_id": request_id,
        "question": question,
        "verdict": verdict,
        "score": score,
        **{k: metadata[k] for k in ("captured_at", "feedback_at", "model_version")},
        "served_answer": metadata["served_answer"],
        "task": None,
    }
    served = metadata["served_answer"]
    accepted = extract_final_answer(served, "text") if isinstance(served, str) else None
    if verdict == "right" and accepted:
        # the accepted answer is the one served (its stated final answer, as verifiers read
        # it): later versions are matched against it
        row["task"] = _task(
            request_id, question, accepted, None, None, metadata, defaults
        ).to_record()
    out.evaluation.append(row)


def slice_tasks(evaluation: Iterable[Mapping[str, Any]]) -> list[Task]:
    """The verifiable part of an evaluation slice: the tasks of its ``right`` verdicts
    (reference = the accepted served answer), in the slice's order; the rest (``wrong``
    verdicts, scores) has no reference to check a new answer against."""
    return [Task.from_record(row["task"]) for row in evaluation if row.get("task")]


def load_traffic(
    folder: str | Path,
    test_questions: EvaluationIndex | Mapping[str, Iterable[str]] | Iterable[str],
    *,
    since: str | None = None,
    domain: str = "traffic",
    difficulty: str = "medium",
    similarity_threshold: float = DEFAULT_SIMILARITY_THRESHOLD,
) -> TrafficTasks:
    """:func:`traffic_tasks` over the capture folder's files (a missing folder gives
    nothing); unreadable lines are counted in ``summary.unreadable_lines``."""
    captured, bad_requests = read_records(folder, REQUESTS_STEM)
    feedback, bad_feedback = read_records(folder, FEEDBACK_STEM)
    result = traffic_tasks(
        captured,
        feedback,
        test_questions,
        since=since,
        domain=domain,
        difficulty=difficulty,
        similarity_threshold=similarity_threshold,
    )
    result.summary["unreadable_lines"] = bad_requests + bad_feedback
    return result
