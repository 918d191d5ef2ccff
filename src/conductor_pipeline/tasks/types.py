"""The task record shared by data preparation, the sandbox workers, training and evaluation."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# What a reference answer looks like; tells verifiers and simulated workers how to format.
ANSWER_FORMATS = ("number", "math", "letter", "text", "code")
# Verifier names resolvable by `conductor_pipeline.tasks.verifiers.verify`.
VERIFIERS = ("math", "multiple_choice", "exact", "numeric", "code", "reasoning_gym")


@dataclass(frozen=True)
class Task:
    """One question with everything needed to check an answer to it.

    ``metadata`` holds what a verifier needs beyond the reference answer (tests and entry
    point for code, the reasoning-gym entry, choices for multiple choice). It must be
    JSON-serialisable, because splits are stored as tables with it as a JSON column.
    """

    id: str
    domain: str
    difficulty: str
    question: str
    answer: str
    answer_format: str
    verifier: str
    source: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(
                f"Task {self.id!r}: unknown answer_format {self.answer_format!r}; expected one of {ANSWER_FORMATS}"
            )
        if self.verifier not in VERIFIERS:
            raise ValueError(
                f"Task {self.id!r}: unknown verifier {self.verifier!r}; expected one of {VERIFIERS}"
            )
        if not self.question.strip():
            raise ValueError(f"Task {self.id!r}: empty question")

    def to_record(self) -> dict[str, Any]:
        """A flat row for a table: ``metadata`` becomes a JSON string."""
        row = asdict(self)
        row["metadata"] = json.dumps(self.metadata, sort_keys=True, default=str)
        return row

    @classmethod
    def from_record(cls, row: dict[str, Any]) -> Task:
        metadata = row.get("metadata") or {}
        if isinstance(metadata, str):
            metadata = json.loads(metadata)
        return cls(
            id=str(row["id"]),
            domain=str(row["domain"]),
            difficulty=str(row["difficulty"]),
            question=str(row["question"]),
            answer=str(row["answer"]),
            answer_format=str(row["answer_format"]),
            verifier=str(row["verifier"]),
            source=str(row["source"]),
            metadata=dict(metadata),
        )
