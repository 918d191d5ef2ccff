"""One evaluated (system, question) pair as a flat, JSON-friendly record.

Every system — the Conductor, baselines, derived systems — produces the same record, so the
metrics never need to know which system they look at. ``detail`` keeps everything else
(the full orchestration record for a Conductor, the calls of a baseline) and becomes a JSON
string column in the per-question table.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from conductor_pipeline.hashing import content_hash
from conductor_pipeline.workflow import (
    ConductorCall,
    ExecutionResult,
    OrchestrationResult,
    RoundRecord,
    StepRecord,
    WorkflowParseError,
    parse_workflow,
)


@dataclass
class QuestionResult:
    """The outcome of one system on one question.

    ``cost_usd`` and ``tokens`` are the *workers'* (cost at list price, also for replies
    served from the response cache); ``conductor_tokens`` are the Conductor's own.
    ``failed_calls`` counts worker calls that ended in an infrastructure failure after
    every retry, and ``infra_failure`` marks a question touched by one (or by an error of
    the system itself, in ``error``): such a question stays in the table but has no
    answer to judge; the metrics leave it out of accuracy and a resume runs it again.
    ``parse_failure``: the Conductor produced no parseable workflow in its allowed attempts.
    """

    system: str
    variant: str
    question_id: str
    split: str
    domain: str
    difficulty: str
    source: str = ""
    correct: bool = False
    score: float = 0.0
    answer: str = ""
    extracted: str | None = None
    verdict: str = ""
    cost_usd: float = 0.0
    tokens: int = 0
    conductor_tokens: int = 0
    calls: int = 0
    latency_s: float = 0.0
    failed_calls: int = 0
    infra_failure: bool = False
    parse_failure: bool = False
    failed_samples: int = 0
    n_steps: int | None = None
    access_pattern: str | None = None
    workers: list[str] = field(default_factory=list)
    cache_hits: int = 0
    policy: str | None = None
    error: str | None = None
    note: str | None = None
    question_hash: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def hash_task(question: str, answer: str) -> str:
        """Tells a stored result for another question under a reused id apart."""
        return content_hash(f"{question}\x00{answer}".encode(), length=16)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.system, self.question_id, self.variant)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> QuestionResult:
        known = {k: v for k, v in row.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def to_row(self) -> dict[str, Any]:
        """A row of the per-question table (``workers`` and ``detail`` as JSON strings)."""
        row = asdict(self)
        row["workers"] = json.dumps(self.workers)
        row["detail"] = json.dumps(self.detail, default=str, sort_keys=True)
        return row


def orchestration_from_record(record: dict[str, Any]) -> OrchestrationResult:
    """Rebuild an :class:`OrchestrationResult` from its ``to_dict()`` record (e.g. to log
    an MLflow trace of a stored evaluation result). Worker counts come from the record."""
    names = _worker_names(record)
    rounds = []
    for item in record.get("rounds") or []:
        workflow = None
        text = item.get("workflow_text") or ""
        if text:
            try:
                workflow = parse_workflow(text, max(len(names), _max_worker(item) + 1))
            except WorkflowParseError:
                workflow = None
        execution = None
        if item.get("execution"):
            data = dict(item["execution"])
            steps = []
            for step in data.pop("steps", []):
                step = {k: v for k, v in step.items() if k in StepRecord.__dataclass_fields__}
                step["access"] = tuple(step.get("access") or ())
                steps.append(StepRecord(**step))
            fields = {k: v for k, v in data.items() if k in ExecutionResult.__dataclass_fields__}
            execution = ExecutionResult(steps=steps, **fields)
        rounds.append(
            RoundRecord(
                item.get("round", 0),
                workflow,
                execution,
                kept_previous=bool(item.get("kept_previous")),
                note=item.get("note"),
            )
        )
    calls = [
        ConductorCall(**{k: v for k, v in c.items() if k in ConductorCall.__dataclass_fields__})
        for c in record.get("conductor_calls") or []
    ]
    return OrchestrationResult(
        question=record.get("question", ""),
        answer=record.get("answer", ""),
        rounds=rounds,
        conductor_calls=calls,
        format_failure=bool(record.get("format_failure")),
        latency_s=float(record.get("latency_s") or 0.0),
        worker_names=names,
        stopped_by=record.get("stopped_by"),
    )


def _worker_names(record: dict[str, Any]) -> list[str]:
    names = record.get("worker_names")
    return list(names) if names else []


def _max_worker(round_item: dict[str, Any]) -> int:
    steps = (round_item.get("execution") or {}).get("steps") or []
    return max((int(s.get("worker", 0)) for s in steps), default=0)


def results_frame(results: list[QuestionResult]):
    """The per-question table (one row per result, ``detail`` as a JSON string column)."""
    import pandas as pd

    columns = list(QuestionResult.__dataclass_fields__)
    return pd.DataFrame([r.to_row() for r in results], columns=columns)
