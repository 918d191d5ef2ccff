"""Metrics over the per-question table: accuracy with a bootstrap interval, cost, tokens,
calls, latency, failures, workflow statistics, and paired significance against the Conductor.

Input is the per-question table (one row per system and question, the columns of
:meth:`QuestionResult.to_row`). A question marked ``infra_failure`` (a worker call that
failed after every retry, or an error of the system itself) has no answer to judge: it is
left out of ``n``, accuracy and the per-question means, and counted in ``infra_failures``
(its failed calls still count in ``failed_calls``); the next resume runs it again. A
Conductor parse failure is the Conductor's own doing: it stays in ``n`` and counts as
wrong (``parse_failures`` counts those questions).
"""

from __future__ import annotations

import json
import math
import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from conductor_pipeline.evaluation.config import CONDUCTOR_SYSTEMS
from conductor_pipeline.evaluation.registry import rank_of

# the columns DESIGN.md fixes, in this order, before any other
CONTRACT_COLUMNS = [
    "system",
    "n",
    "accuracy",
    "ci_low",
    "ci_high",
    "cost_usd_per_q",
    "tokens_per_q",
    "calls_per_q",
    "latency_p50_s",
    "infra_failures",
]
# the extra columns, in this order after the contract ones (then usage_<worker>, policy, note)
EXTRA_COLUMNS = [
    "latency_p95_s",
    "parse_failures",
    "failed_calls",
    "failed_samples",
    "p_value_vs_conductor",
    "accuracy_delta_vs_conductor",
    "conductor_tokens_per_q",
    "cache_hit_share",
    "simulated_pool",
    "simulated_call_share",
    "steps_per_workflow",
    "pattern_single",
    "pattern_chain",
    "pattern_independent",
    "pattern_tree",
]
PATTERNS = ("single", "chain", "independent", "tree")
REFERENCE = "conductor"


def bootstrap_ci(
    correct: Sequence[bool] | np.ndarray,
    *,
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int | Sequence[int] = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of 0/1 outcomes (NaN, NaN when empty)."""
    # kept on numpy rather than scipy.stats.bootstrap (same percentile method, agreeing within
    # resampling noise: tests/evaluation/test_metrics.py): scipy refuses a one-question group
    # and draws other resamples, which would move every interval the reports have printed
    values = np.asarray(correct, dtype=float)
    if values.size == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = rng.choice(values, size=(samples, values.size), replace=True).mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return (float(low), float(high))


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Two-sided exact McNemar test of paired 0/1 outcomes: a binomial test with p = 1/2 on
    the discordant pairs. 1.0 when there are none."""
    if len(a) != len(b):
        raise ValueError("mcnemar_exact: paired outcomes must have the same length")
    only_a = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    only_b = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    if only_a + only_b == 0:
        return 1.0
    # scipy's exact binomial test: at p = 1/2 its two-sided p is twice the smaller tail, capped
    # at 1, the figure this function computed by hand before (checked in the tests); scipy is
    # installed with mlflow. Imported here: scipy.stats takes 0.8 s to import, and
    # `conductor ask` and `conductor serve` import this package for its view of the pool
    from scipy.stats import binomtest

    return float(binomtest(only_a, only_a + only_b, 0.5).pvalue)


def _seed(seed: int, *names: str) -> list[int]:
    return [seed, *(zlib.crc32(n.encode("utf-8")) for n in names)]


def step_workers(value: Any) -> list[str]:
    """The workers of one result row's ``workers`` column (a JSON list, or a list once read
    back): one name per workflow step; anything else gives none."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    return list(value) if isinstance(value, list | tuple | np.ndarray) else []


def system_order(names: Sequence[str]) -> list[str]:
    """By each kind's declared rank (:mod:`~conductor_pipeline.evaluation.kinds`): the
    Conductor systems first (the warm start right after the trained Conductor it started,
    then the untrained base), then solo, moa, random, best-of-n, router, handcrafted, oracle;
    names of no registered kind last; ties in the order given."""
    seen = list(dict.fromkeys(names))
    return sorted(seen, key=lambda n: (rank_of(n), seen.index(n)))


def _system_row(
    rows: pd.DataFrame,
    system: str,
    *,
    reference: pd.DataFrame | None,
    samples: int,
    confidence: float,
    seed: int,
    scope: str,
    worker_names: Sequence[str],
) -> dict[str, Any]:
    failed = rows["infra_failure"].astype(bool)
    every, rows = rows, rows[~failed]
    correct = rows["correct"].astype(bool).to_numpy()
    low, high = bootstrap_ci(
        correct, samples=samples, confidence=confidence, seed=_seed(seed, system, scope)
    )
    latency = rows["latency_s"].astype(float)
    row: dict[str, Any] = {
        "system": system,
        "n": len(rows),
        "accuracy": float(correct.mean()) if len(rows) else math.nan,
        "ci_low": low,
        "ci_high": high,
        "cost_usd_per_q": float(rows["cost_usd"].mean()) if len(rows) else math.nan,
        "tokens_per_q": float(rows["tokens"].mean()) if len(rows) else math.nan,
        "calls_per_q": float(rows["calls"].mean()) if len(rows) else math.nan,
        "latency_p50_s": float(latency.quantile(0.5)) if len(rows) else math.nan,
        "infra_failures": int(failed.sum()),
        "latency_p95_s": float(latency.quantile(0.95)) if len(rows) else math.nan,
        "parse_failures": int(rows["parse_failure"].astype(bool).sum()),
        "failed_calls": int(every["failed_calls"].sum()),
        "failed_samples": int(rows["failed_samples"].sum()),
        "conductor_tokens_per_q": float(rows["conductor_tokens"].mean()) if len(rows) else math.nan,
    }
    calls = int(rows["calls"].sum())
    row["cache_hit_share"] = float(rows["cache_hits"].sum()) / calls if calls else math.nan
    # paired significance against the Conductor, on the questions both answered
    if reference is not None and system != REFERENCE and len(reference):
        paired = reference.merge(
            rows[["question_id", "correct"]], on="question_id", suffixes=("_ref", "")
        )
        if len(paired):
            row["p_value_vs_conductor"] = mcnemar_exact(
                paired["correct_ref"].astype(bool).tolist(), paired["correct"].astype(bool).tolist()
            )
            row["accuracy_delta_vs_conductor"] = float(
                paired["correct"].astype(bool).mean() - paired["correct_ref"].astype(bool).mean()
            )
    # workflow statistics, for the systems that write workflows
    used = [w for ws in rows["workers"] for w in step_workers(ws)]
    row["simulated_call_share"] = (
        sum(1 for w in used if str(w).startswith("sim-")) / len(used) if used else math.nan
    )
    if system in CONDUCTOR_SYSTEMS:
        with_workflow = rows[rows["n_steps"].notna()]
        row["steps_per_workflow"] = (
            float(with_workflow["n_steps"].mean()) if len(with_workflow) else math.nan
        )
        patterns = Counter(with_workflow["access_pattern"])
        for pattern in PATTERNS:
            row[f"pattern_{pattern}"] = (
                patterns.get(pattern, 0) / len(with_workflow) if len(with_workflow) else math.nan
            )
        counts = Counter(used)
        for name in worker_names:
            row[f"usage_{name}"] = counts.get(name, 0) / len(used) if used else math.nan
    policies = [p for p in every.get("policy", pd.Series(dtype=object)).dropna().unique()]
    if policies:
        row["policy"] = "; ".join(map(str, policies))
    notes = [n for n in every.get("note", pd.Series(dtype=object)).dropna().unique()]
    if system.startswith("best-of-n:") and notes:
        row["note"] = str(notes[0])
    return row


def _worker_names(frame: pd.DataFrame) -> list[str]:
    names: list[str] = []
    for system in frame["system"].unique():
        if system.startswith("solo:"):
            names.append(system[5:])
    for ws in frame["workers"]:
        for w in step_workers(ws):
            if w not in names:
                names.append(w)
    return names


def summarise(
    results: pd.DataFrame,
    *,
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    split: str | None = "test",
) -> pd.DataFrame:
    """One row per system: the contract columns first, then the extra ones."""
    frame = results if split is None else results[results["split"] == split]
    return _summary(frame, samples=samples, confidence=confidence, seed=seed, scope="all")


def summarise_by_domain(
    results: pd.DataFrame,
    *,
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    split: str | None = "test",
    by: str = "domain",
) -> pd.DataFrame:
    """One row per (domain, system), the same columns as :func:`summarise` after ``domain``.
    ``by="source"`` groups by benchmark instead; the group is still in the ``domain`` column,
    so that readers of the table need not know how it was grouped."""
    frame = results if split is None else results[results["split"] == split]
    parts = []
    for domain in sorted(frame[by].unique()):
        part = _summary(
            frame[frame[by] == domain],
            samples=samples,
            confidence=confidence,
            seed=seed,
            scope=domain,
        )
        part.insert(0, "domain", domain)
        parts.append(part)
    if not parts:
        return pd.DataFrame(columns=["domain", *CONTRACT_COLUMNS])
    return pd.concat(parts, ignore_index=True)


def _summary(
    frame: pd.DataFrame, *, samples: int, confidence: float, seed: int, scope: str
) -> pd.DataFrame:
    if frame.empty:
        return pd.DataFrame(columns=CONTRACT_COLUMNS)
    reference = frame[(frame["system"] == REFERENCE) & ~frame["infra_failure"].astype(bool)][
        ["question_id", "correct"]
    ]
    names = _worker_names(frame)
    rows = [
        _system_row(
            frame[frame["system"] == system],
            system,
            reference=reference if len(reference) else None,
            samples=samples,
            confidence=confidence,
            seed=seed,
            scope=scope,
            worker_names=names,
        )
        for system in system_order(frame["system"].tolist())
    ]
    summary = pd.DataFrame(rows)
    summary["simulated_pool"] = any(str(n).startswith("sim-") for n in names)
    first = [c for c in EXTRA_COLUMNS if c in summary.columns]
    later = [c for c in summary.columns if c not in CONTRACT_COLUMNS and c not in first]
    usage = [c for c in later if c.startswith("usage_")]
    rest = [c for c in later if c not in usage and c not in ("policy", "note")]
    tail = [c for c in ("policy", "note") if c in summary.columns]
    return summary[CONTRACT_COLUMNS + first + rest + usage + tail]


def pareto_front(summary: pd.DataFrame, *, exclude: Sequence[str] = ("oracle",)) -> list[str]:
    """Systems no other system beats on both cost (lower) and accuracy (higher), cheapest
    first. The oracle is an upper bound, not a system one could run, so it is left out."""
    rows = summary[~summary["system"].isin(exclude)].dropna(subset=["accuracy", "cost_usd_per_q"])
    points = sorted(
        zip(rows["cost_usd_per_q"], rows["accuracy"], rows["system"], strict=True),
        key=lambda p: (p[0], -p[1]),
    )
    front, best = [], -math.inf
    for _cost, accuracy, system in points:
        if accuracy > best:
            front.append(system)
            best = accuracy
    return front


def mlflow_metrics(summary: pd.DataFrame, prefix: str | None = None) -> dict[str, dict[str, float]]:
    """``{"<system>.<metric>": {"value": v, "step": 0}}`` for kedro-mlflow's metrics dataset,
    whose ``prefix: eval`` makes them ``eval.<system>.<metric>`` (``prefix`` here adds one
    itself). MLflow names allow no ``+``: ``conductor+recursion`` becomes
    ``conductor_recursion``."""
    keys = [
        "accuracy",
        "ci_low",
        "ci_high",
        "cost_usd_per_q",
        "tokens_per_q",
        "calls_per_q",
        "latency_p50_s",
        "latency_p95_s",
        "infra_failures",
        "parse_failures",
        "p_value_vs_conductor",
        "steps_per_workflow",
    ]
    out: dict[str, dict[str, float]] = {}
    lead = f"{prefix}." if prefix else ""
    for row in summary.to_dict(orient="records"):
        name = metric_name(row["system"])
        for key in keys:
            value = row.get(key)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            out[f"{lead}{name}.{key}"] = {"value": float(value), "step": 0}
        out[f"{lead}{name}.n"] = {"value": float(row["n"]), "step": 0}
    return out


def metric_name(system: str) -> str:
    return "".join(c if c.isalnum() or c in "_-. :/" else "_" for c in system)


def format_table(summary: pd.DataFrame) -> str:
    """The contract columns (plus parse failures and p-values) as a fixed-width table."""
    columns = [*CONTRACT_COLUMNS, "parse_failures", "p_value_vs_conductor"]
    shown = summary[[c for c in columns if c in summary.columns]].copy()
    formats = {
        "accuracy": "{:.3f}",
        "ci_low": "{:.3f}",
        "ci_high": "{:.3f}",
        "cost_usd_per_q": "{:.6f}",
        "tokens_per_q": "{:.0f}",
        "calls_per_q": "{:.2f}",
        "latency_p50_s": "{:.2f}",
        "p_value_vs_conductor": "{:.3g}",
    }
    for column, fmt in formats.items():
        if column in shown:
            shown[column] = shown[column].map(lambda v, f=fmt: "" if pd.isna(v) else f.format(v))
    return shown.to_string(index=False)
