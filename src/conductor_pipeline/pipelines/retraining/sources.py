"""retraining nodes for the sources that grow between runs (``retraining_sources``).

After data_prep's split, :func:`collect_retraining_sources` reads every enabled source from
its watermark (served traffic with feedback, a JSONL drop folder, LiveCodeBench by
``contest_date``: ``tasks.sources.growing``): new training tasks join the training split
(never the test split, the fixed anchor), and the ``right`` verdicts on served answers form
the new evaluation slice. :func:`evaluate_traffic_slice` measures the challenger and the
champion on that slice, for the promotion gate next to the fixed test set. The watermarks
move in :func:`commit_source_watermarks`, which waits for the rest of the run: a run that
fails takes the same data again next time.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pandas as pd

from conductor_pipeline.paths import project_root
from conductor_pipeline.pipelines.retraining.watermarks import watermark_store
from conductor_pipeline.tasks.frames import tasks_from_frame, tasks_to_frame
from conductor_pipeline.tasks.sources.growing import (
    collect_sources,
    commit_all,
    join_training,
    sources_settings,
)
from conductor_pipeline.tasks.sources.traffic import slice_tasks

logger = logging.getLogger(__name__)

# the systems measured on the slice: the version under test and the champion it may replace
_SLICE_SYSTEMS = ["conductor", "champion"]


def _slice_counts(evaluation: list[dict[str, Any]]) -> dict[str, Any]:
    """The evaluation slice in figures (the rows themselves hold questions and answers)."""
    verdicts = Counter(str(row.get("verdict")) for row in evaluation if row.get("verdict"))
    scores = [float(row["score"]) for row in evaluation if row.get("score") is not None]
    return {
        "right": verdicts.get("right", 0),
        "wrong": verdicts.get("wrong", 0),
        "scores": len(scores),
        "mean_score": round(sum(scores) / len(scores), 4) if scores else None,
    }


def collect_retraining_sources(
    train_tasks: pd.DataFrame,
    test_tasks: pd.DataFrame,
    retraining_lock: dict[str, Any],
    params: dict[str, Any],
    validation_tasks: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """The training split with what is new in every enabled source after it, the new
    evaluation slice (tasks of ``right`` verdicts) and the run's source report. A new
    question that is, or is near, one of the validation or test split is left out; those
    splits are not touched and no watermark is written here."""
    settings = sources_settings(params)
    root = project_root()
    store = watermark_store(settings.watermarks, root)
    evaluation_questions = {"test": test_tasks["question"].astype(str).tolist()}
    if validation_tasks is not None:
        evaluation_questions["validation"] = validation_tasks["question"].astype(str).tolist()
    collected = collect_sources(settings, store, root=root, test_questions=evaluation_questions)
    joined, left_out = join_training(tasks_from_frame(train_tasks), collected.tasks())
    evaluation_slice = slice_tasks(collected.evaluation)
    report = {
        **collected.report(),
        "added_to_training": len(joined) - len(train_tasks),
        "already_in_training": left_out,
        "evaluation_slice": {"tasks": len(evaluation_slice), **_slice_counts(collected.evaluation)},
        "watermark_store": settings.watermarks.store,
        "claim": retraining_lock.get("token"),
    }
    if report["unchanged"]:
        logger.info("retraining sources: nothing new since the last run (unchanged)")
    else:
        logger.info(
            "retraining sources: %d new training tasks (%d already in the split), "
            "%d questions in the new evaluation slice",
            report["added_to_training"],
            len(left_out),
            len(evaluation_slice),
        )
    return tasks_to_frame(joined), tasks_to_frame(evaluation_slice), report


def evaluate_traffic_slice(
    traffic_slice_tasks: pd.DataFrame,
    train_tasks: pd.DataFrame,
    validation_tasks: pd.DataFrame,
    worker_pool_config: dict[str, Any],
    worker_credentials: dict[str, Any],
    conductor_params: dict[str, Any],
    evaluation_params: dict[str, Any],
    serving_params: dict[str, Any],
    conductor_model_version: dict[str, Any],
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The challenger (the version training registered) and the champion on the new slice,
    every question of it, with the evaluation's settings; figures per system for the
    promotion gate. An empty slice is measured by nobody: ``skipped`` says why."""
    from conductor_pipeline.evaluation.metrics import summarise
    from conductor_pipeline.pipelines.evaluation.nodes import run_evaluation
    from conductor_pipeline.pipelines.promotion.nodes import figures_from_summary

    questions = len(traffic_slice_tasks)
    if not questions:
        reason = "no new evaluation slice (no 'right' verdict on served answers since the last run)"
        logger.info("traffic slice: %s", reason)
        return pd.DataFrame(), {"questions": 0, "skipped": reason}
    params = {
        **evaluation_params,
        "systems": _SLICE_SYSTEMS,
        "test_per_domain": None,
        "benchmarks": {},
        "trace_sample": 0,
    }
    results, info = run_evaluation(
        traffic_slice_tasks,
        train_tasks,
        validation_tasks,
        worker_pool_config,
        worker_credentials,
        conductor_params,
        params,
        serving_params,
        conductor_model_version,
    )
    summary = summarise(results, samples=200, seed=int(params.get("seed") or 0))
    figures = {}
    for system, name in (("conductor", "challenger"), ("champion", "champion")):
        found = figures_from_summary(summary, system, results)
        figures[name] = vars(found) if found is not None else None
    skipped = None
    if figures["champion"] is None:
        skipped = "the champion was not evaluated on the slice (none yet, or not loadable here)"
    return results, {
        "questions": questions,
        "skipped": skipped,
        "conductor_variant": info.get("conductor_variant"),
        "champion_variant": info.get("champion_variant"),
        **figures,
    }


def commit_source_watermarks(
    retraining_sources_report: dict[str, Any],
    promotion_decision: dict[str, Any],
    training_report: str,
    evaluation_report: str,
    params: dict[str, Any],
) -> dict[str, Any]:
    """Store the watermarks the run read to (after training, evaluation, promotion and the
    reports: the run succeeded). Whatever the decision, the run used this data: the next one
    starts after it. Returns which sources moved, for the run's report."""
    settings = sources_settings(params)
    store = watermark_store(settings.watermarks, project_root())
    moved = commit_all(store, retraining_sources_report)
    logger.info(
        "retraining sources: watermarks moved for %s", ", ".join(moved) if moved else "none"
    )
    return {
        "moved": moved,
        "unchanged": bool(retraining_sources_report.get("unchanged")),
        "decision": promotion_decision.get("decision"),
        "reports_rendered": bool(training_report) and bool(evaluation_report),
    }
