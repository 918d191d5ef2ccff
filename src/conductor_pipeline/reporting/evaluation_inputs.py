"""The evaluation report's inputs and the names it prints: the evaluation pipeline's files,
read with a note when one is missing, and the labels of systems and workers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from conductor_pipeline.evaluation.registry import label_note
from conductor_pipeline.reporting.display import MissingInput


def _need(path: str | Path | None, what: str) -> Path:
    if not path:
        raise MissingInput(f"{what[0].upper()}{what[1:]} is not available (no path was given)")
    path = Path(path)
    if not path.is_file():
        raise MissingInput(f"{what} not found at {path}")
    return path


def load_summary(path: str | Path | None) -> pd.DataFrame:
    return pd.read_csv(_need(path, "the evaluation summary"))


def load_by_domain(path: str | Path | None) -> pd.DataFrame:
    return pd.read_csv(_need(path, "the per-domain summary"))


def load_results(path: str | Path | None) -> pd.DataFrame:
    return pd.read_parquet(_need(path, "the per-question results"))


def load_json(path: str | Path | None, what: str) -> dict[str, Any]:
    return json.loads(_need(path, what).read_text(encoding="utf-8"))


def system_label(system: str) -> str:
    """The name reports show: simulated workers say so, and a kind's ``label_note`` is
    added (``handcrafted (told the domain)``)."""
    worker = system.split(":", 1)[1] if ":" in system else ""
    if worker.startswith("sim-"):
        return f"{system} (simulated worker)"
    note = label_note(system)
    return f"{system} ({note})" if note else system


def sim_label(name: Any) -> str:
    return f"{name} (sim)" if str(name).startswith("sim-") else str(name)


def as_count(value: Any) -> int:
    """A count that may arrive as a float or NaN (a missing workflow has no steps)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0
    return int(number) if math.isfinite(number) else 0


def _steps_text(value: Any) -> str:
    steps = as_count(value)
    return f"{steps} step" + ("" if steps == 1 else "s")
