"""What an evaluation runs on: its questions (the test split or the configured benchmarks,
without any question the Conductor saw in training) and the identity of the worker pool
that answers them, which keys the stored results."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd

from conductor_pipeline.evaluation.config import EvaluationConfig
from conductor_pipeline.evaluation.runner import select_tasks
from conductor_pipeline.evaluation.systems import fingerprint
from conductor_pipeline.hashing import content_hash
from conductor_pipeline.tasks import Task
from conductor_pipeline.tasks.frames import tasks_from_frame

logger = logging.getLogger(__name__)


def pool_fingerprint(worker_pool_config: dict[str, Any], root: Path) -> str:
    """What the answers of a pool depend on: its configuration (not the cache, the usage
    log or injected faults, which retries and the infra-failure rule keep out of every
    stored answer) and, for the sandbox, the content of the worker profiles."""
    relevant = {
        k: v for k, v in worker_pool_config.items() if k not in ("cache", "usage_log", "faults")
    }
    sandbox = dict(relevant.get("sandbox") or {})
    profiles = sandbox.pop("profiles", None)
    sandbox.pop("tasks", None)
    sandbox.pop("torch_threads", None)
    sandbox.pop("real_model_concurrency", None)
    relevant["sandbox"] = sandbox
    if profiles:
        path = Path(profiles) if Path(profiles).is_absolute() else root / profiles
        relevant["profiles_sha"] = (
            content_hash(path.read_bytes()) if path.is_file() else str(profiles)
        )
    return fingerprint(relevant)


def evaluation_questions(
    config: EvaluationConfig,
    test_tasks: pd.DataFrame,
    train_tasks: pd.DataFrame,
    validation_tasks: pd.DataFrame,
) -> list[Task]:
    """The questions evaluated: the prepared test split, or (``evaluation.benchmarks``) the
    configured benchmarks, without any question the Conductor saw in training or
    validation; then ``test_per_domain`` per domain (or per source)."""
    from conductor_pipeline.tasks.sources import load_source
    from conductor_pipeline.tasks.splits import normalise_question

    if config.benchmarks:
        tasks = []
        for name, options in config.benchmarks.items():
            try:
                loaded = load_source(name, seed=config.seed, **options)
            except (TypeError, ValueError) as err:
                raise ValueError(f"evaluation.benchmarks.{name}: {err}") from err
            logger.info("evaluation: benchmark %s, %d questions", name, len(loaded))
            tasks.extend(loaded)
    else:
        tasks = tasks_from_frame(test_tasks)
    seen = {
        normalise_question(q)
        for frame in (train_tasks, validation_tasks)
        for q in frame["question"]
    }
    kept = [t for t in tasks if normalise_question(t.question) not in seen]
    if len(kept) < len(tasks):
        logger.warning(
            "evaluation: %d questions dropped because they are in the train or validation split",
            len(tasks) - len(kept),
        )
    return select_tasks(kept, config.test_per_domain, config.seed, by=config.report_by)
