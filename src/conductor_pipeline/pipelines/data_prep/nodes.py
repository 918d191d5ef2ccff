"""data_prep nodes: collect tasks from the configured sources, deduplicate, balance, split."""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Any

import pandas as pd

from conductor_pipeline.config_checks import check_keys
from conductor_pipeline.setup_errors import SetupError
from conductor_pipeline.tasks import Task
from conductor_pipeline.tasks.frames import tasks_from_frame, tasks_to_frame
from conductor_pipeline.tasks.sources import SOURCES, load_source
from conductor_pipeline.tasks.splits import (
    SPLIT_NAMES,
    balance_domains,
    deduplicate,
    normalise_question,
    split_tasks,
)

logger = logging.getLogger(__name__)

_KNOWN_KEYS = {"seed", "sources", "domain_quota", "split_ratios"}


def validate_params(params: dict[str, Any]) -> None:
    """Fail before any work with a message that names the offending ``data_prep`` key."""
    check_keys("data_prep", params, _KNOWN_KEYS)
    if not isinstance(params.get("seed"), int):
        raise ValueError("data_prep.seed: must be an integer")
    sources = params.get("sources")
    if not isinstance(sources, dict) or not sources:
        raise ValueError("data_prep.sources: must map at least one source name to its options")
    for name, options in sources.items():
        if name not in SOURCES:
            raise ValueError(f"data_prep.sources.{name}: unknown source; known: {sorted(SOURCES)}")
        if options is not None and not isinstance(options, dict):
            raise ValueError(f"data_prep.sources.{name}: options must be a mapping")
    ratios = params.get("split_ratios")
    if not isinstance(ratios, dict) or set(ratios) != set(SPLIT_NAMES):
        raise ValueError(
            f"data_prep.split_ratios: must give exactly {list(SPLIT_NAMES)}, got {ratios!r}"
        )
    for name, share in ratios.items():
        if not isinstance(share, int | float) or not 0 <= share <= 1:
            raise ValueError(
                f"data_prep.split_ratios.{name}: must be a number in [0, 1], got {share!r}"
            )
    if not math.isclose(sum(ratios.values()), 1.0, abs_tol=1e-9):
        raise ValueError(
            f"data_prep.split_ratios: shares must sum to 1, got {sum(ratios.values()):g}"
        )
    if ratios["test"] == 0 or ratios["train"] == 0:
        raise ValueError("data_prep.split_ratios: train and test shares must be positive")
    for domain, limit in (params.get("domain_quota") or {}).items():
        if limit is not None and (not isinstance(limit, int) or limit <= 0):
            raise ValueError(
                f"data_prep.domain_quota.{domain}: must be a positive integer or null, got {limit!r}"
            )


def collect_tasks(params: dict[str, Any]) -> pd.DataFrame:
    """Load every configured source into one task table."""
    validate_params(params)
    tasks: list[Task] = []
    for name, options in params["sources"].items():
        try:
            loaded = load_source(name, seed=params["seed"], **(options or {}))
        except (ValueError, TypeError) as err:
            raise ValueError(f"data_prep.sources.{name}: {err}") from err
        except (RuntimeError, FileNotFoundError) as err:
            # a benchmark that is neither in the Hugging Face cache nor at its data_files path
            raise SetupError(
                f"data_prep.sources.{name}: the dataset is not on this machine ({err})",
                f"download it into the Hugging Face cache on a machine with network access and "
                f"copy the cache here, or point data_prep.sources.{name}.data_files at a local "
                f"copy (conf/local/parameters_data_prep.yml), or drop the source from "
                f"data_prep.sources; the CPU sandbox needs no download: `make run`",
            ) from err
        logger.info("source %s: %d tasks", name, len(loaded))
        tasks.extend(loaded)
    return tasks_to_frame(tasks)


def deduplicate_tasks(raw_tasks: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Drop repeated questions (normalised text) so that none can land in two splits."""
    kept, dropped = deduplicate(tasks_from_frame(raw_tasks))
    if dropped:
        logger.info("dropped %d duplicate questions", len(dropped))
    report = {
        "n_raw": len(raw_tasks),
        "n_unique": len(kept),
        "dropped": [list(pair) for pair in dropped],
    }
    return tasks_to_frame(kept), report


def make_splits(
    unique_tasks: pd.DataFrame, params: dict[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Balance domains to their quota, then split with the configured ratios."""
    validate_params(params)
    balanced, balance_report = balance_domains(
        tasks_from_frame(unique_tasks), params.get("domain_quota") or {}, seed=params["seed"]
    )
    for domain, quota in (params.get("domain_quota") or {}).items():
        kept = balance_report.get(domain, {}).get("kept", 0)
        if quota is not None and kept < quota:
            logger.warning("domain %s: quota %d not met, %d tasks available", domain, quota, kept)
    splits = split_tasks(balanced, params["split_ratios"], seed=params["seed"])
    _check_disjoint(splits)
    frames = tuple(tasks_to_frame(splits[name]) for name in SPLIT_NAMES)
    return (*frames, balance_report)


def _check_disjoint(splits: dict[str, list[Task]]) -> None:
    owner: dict[str, str] = {}
    for name, tasks in splits.items():
        for task in tasks:
            key = normalise_question(task.question)
            if key in owner and owner[key] != name:
                raise AssertionError(f"task {task.id} appears in both {owner[key]} and {name}")
            owner[key] = name


def summarise_splits(
    train_tasks: pd.DataFrame,
    validation_tasks: pd.DataFrame,
    test_tasks: pd.DataFrame,
    dedup_report: dict[str, Any],
    balance_report: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """Split sizes and domain/difficulty counts, as a JSON report and as MLflow metrics."""
    frames = {"train": train_tasks, "validation": validation_tasks, "test": test_tasks}
    statistics: dict[str, Any] = {
        "n_raw": dedup_report["n_raw"],
        "n_unique": dedup_report["n_unique"],
        "n_duplicates_dropped": len(dedup_report["dropped"]),
        "domain_balance": balance_report,
        "splits": {},
    }
    metrics: dict[str, dict[str, float]] = {
        "data.raw_tasks": {"value": float(dedup_report["n_raw"]), "step": 0},
        "data.duplicates_dropped": {"value": float(len(dedup_report["dropped"])), "step": 0},
    }
    for name, frame in frames.items():
        domains = Counter(frame["domain"])
        difficulties = Counter(frame["difficulty"])
        sources = Counter(frame["source"])
        statistics["splits"][name] = {
            "n": len(frame),
            "domains": dict(sorted(domains.items())),
            "difficulties": dict(sorted(difficulties.items())),
            "sources": dict(sorted(sources.items())),
        }
        metrics[f"split.{name}.n"] = {"value": float(len(frame)), "step": 0}
        for domain, count in domains.items():
            metrics[f"split.{name}.domain.{domain}"] = {"value": float(count), "step": 0}
    return statistics, metrics
