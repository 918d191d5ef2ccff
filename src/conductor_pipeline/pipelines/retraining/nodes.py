"""retraining nodes: a run-level lock, and the questions logged by users as an extra task
source for data_prep.

The lock makes a scheduled run safe to start while another is still going: the first node
claims ``retraining.lock.path``, the last one releases it (conductor_pipeline/run_lock.py,
which also says when a claim left by a dead run is taken over). Everything between is
idempotent: data_prep is seeded, training resumes from its run folder, evaluation reuses
stored results, and promotion records ``unchanged`` when the new version comes from the same
training run as the champion.
"""

from __future__ import annotations

import glob
import json
import logging
import time
from pathlib import Path
from typing import Any

import pandas as pd

from conductor_pipeline.config_checks import check_keys
from conductor_pipeline.hashing import content_hash
from conductor_pipeline.paths import project_root
from conductor_pipeline.run_lock import LockHeld, claim_lock, release_claim
from conductor_pipeline.tasks import Task

logger = logging.getLogger(__name__)

_KNOWN_KEYS = {"start_from", "lock", "logged_questions"}


class RetrainingLocked(LockHeld):
    """Another retraining run holds the lock."""


def retraining_settings(params: dict[str, Any]) -> dict[str, Any]:
    """The ``retraining`` parameters, checked for unknown keys."""
    params = dict(params or {})
    check_keys("retraining", params, _KNOWN_KEYS)
    return params


def _lock_path(params: dict[str, Any]) -> Path:
    path = Path((params.get("lock") or {}).get("path") or "data/retraining.lock")
    return path if path.is_absolute() else project_root() / path


def acquire_lock(params: dict[str, Any]) -> dict[str, Any]:
    """Claim the retraining lock; raise :class:`RetrainingLocked` while another run holds it."""
    params = retraining_settings(params)
    stale_after = float((params.get("lock") or {}).get("stale_after_s") or 43200)
    try:
        return claim_lock(_lock_path(params), stale_after_s=stale_after, holder="retraining run")
    except LockHeld as err:
        raise RetrainingLocked(
            f"{err}; this run does nothing. Delete the file if that run is known to be dead."
        ) from None


def release_lock(
    retraining_lock: dict[str, Any],
    promotion_decision: dict[str, Any],
    training_report: str,
    evaluation_report: str,
    logged_questions_summary: dict[str, Any],
    params: dict[str, Any],
    retraining_watermarks: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The last node: release the lock (if still ours) and summarise the run, with the
    growing sources' watermarks it committed (``unchanged`` when nothing was new)."""
    params = retraining_settings(params)
    released = release_claim(_lock_path(params), retraining_lock.get("token"))
    finished = time.time()
    return {
        "started": retraining_lock.get("started"),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(finished)),
        "seconds": round(finished - float(retraining_lock.get("started_at") or finished), 1),
        "lock_released": released,
        "version": promotion_decision.get("version"),
        "decision": promotion_decision.get("decision"),
        "champion": promotion_decision.get("champion"),
        "reasons": promotion_decision.get("reasons"),
        "reports": {
            "training_report_bytes": len(training_report or ""),
            "evaluation_report_bytes": len(evaluation_report or ""),
        },
        "logged_questions": logged_questions_summary,
        **({"sources": retraining_watermarks} if retraining_watermarks is not None else {}),
    }


def _logged_task(row: dict[str, Any], defaults: dict[str, Any]) -> Task:
    question = str(row.get("question") or "")
    digest = content_hash(question.strip().encode())
    return Task(
        id=str(row.get("id") or f"logged/{digest}"),
        domain=str(row.get("domain") or defaults.get("domain") or "logged"),
        difficulty=str(row.get("difficulty") or defaults.get("difficulty") or "medium"),
        question=question,
        answer=str(row["answer"]),
        answer_format=str(row["answer_format"]),
        verifier=str(row["verifier"]),
        source=str(row.get("source") or "logged"),
        metadata=dict(row.get("metadata") or {}),
    )


def add_logged_questions(
    configured_raw_tasks: pd.DataFrame,
    retraining_lock: dict[str, Any],
    params: dict[str, Any],
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The configured sources' tasks plus every logged question that carries a reference
    answer (data_prep then deduplicates, balances and splits them all). Lines without a
    reference are counted, not used: no reward can be computed for them."""
    params = retraining_settings(params)
    options = dict(params.get("logged_questions") or {})
    patterns = options.get("paths") or []
    if isinstance(patterns, str):
        patterns = [patterns]
    root = project_root()
    files = sorted(
        {
            Path(found)
            for pattern in patterns
            for found in glob.glob(str(pattern if Path(pattern).is_absolute() else root / pattern))
        }
    )
    tasks: list[Task] = []
    summary: dict[str, Any] = {
        "files": [str(f) for f in files],
        "lines": 0,
        "added": 0,
        "without_reference": 0,
        "invalid": [],
        "claim": retraining_lock.get("token"),
    }
    for file in files:
        with file.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                summary["lines"] += 1
                try:
                    row = json.loads(line)
                except ValueError as err:
                    summary["invalid"].append(f"{file.name}:{number}: not JSON ({err})")
                    continue
                if not isinstance(row, dict) or not row.get("question"):
                    summary["invalid"].append(f"{file.name}:{number}: no question")
                    continue
                if not all(row.get(k) for k in ("answer", "answer_format", "verifier")):
                    summary["without_reference"] += 1
                    continue
                try:
                    tasks.append(_logged_task(row, options))
                except (ValueError, TypeError) as err:
                    summary["invalid"].append(f"{file.name}:{number}: {err}")
    summary["added"] = len(tasks)
    if summary["invalid"]:
        logger.warning(
            "retraining: %d logged question lines skipped: %s",
            len(summary["invalid"]),
            "; ".join(summary["invalid"][:5]),
        )
    logger.info(
        "retraining: %d logged questions added from %d files (%d without a reference answer)",
        summary["added"],
        len(files),
        summary["without_reference"],
    )
    if not tasks:
        return configured_raw_tasks, summary
    logged = pd.DataFrame([t.to_record() for t in tasks], columns=list(Task.__dataclass_fields__))
    combined = pd.concat([configured_raw_tasks, logged], ignore_index=True)
    return combined, summary
