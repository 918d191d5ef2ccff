"""The training run's files the training report reads besides its metric history: the
registered model version, the adapter info training returned, and the JSONL of sample
rollouts (with where to find it when the report is not told).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from conductor_pipeline.reporting.display import MissingInput


def _read_json(path: str | Path | None, what: str) -> dict[str, Any]:
    if not path:
        raise MissingInput(f"no {what} path was given")
    path = Path(path)
    if not path.is_file():
        raise MissingInput(f"{what} not found at {path}")
    return json.loads(path.read_text(encoding="utf-8"))


def overview_table(
    model_version_path: str | Path | None, adapter_info_path: str | Path | None
) -> pd.DataFrame:
    """What was trained and registered: version, base model, steps, data and run
    fingerprints, time per stage."""
    facts: dict[str, Any] = {}
    try:
        version = _read_json(model_version_path, "the registered model version")
        facts["registered version"] = f"{version.get('name', 'conductor')}/{version.get('version')}"
        facts["MLflow run"] = version.get("run_id")
    except MissingInput:
        pass
    try:
        info = _read_json(adapter_info_path, "the adapter info")
    except MissingInput:
        info = {}
    for key in (
        "base_model",
        "global_step",
        "recursion_steps",
        "data_version",
        "config_fingerprint",
        "pool_fingerprint",
        "run_fingerprint",
        "resumed_from",
    ):
        if key in info:
            facts[key.replace("_", " ")] = info[key]
    for key, value in (info.get("dataset") or {}).items():
        facts[f"dataset: {key}"] = value
    for key, value in (info.get("seconds") or {}).items():
        facts[f"seconds: {key}"] = value
    if info.get("worker_names"):
        facts["workers"] = ", ".join(info["worker_names"])
    if not facts:
        raise MissingInput("neither the registered version nor the adapter info is available")
    return pd.DataFrame({"fact": list(facts), "value": [str(v) for v in facts.values()]})


def rollout_examples(path: str | Path | None, per_phase: int = 3) -> list[Any]:
    """Sample workflows from the earliest and the latest logged steps.

    Reads the JSONL file of rollout samples training writes (``step``, ``completion`` or
    ``workflow_text``, optional ``reward``, ``parsed``, ``question``); see
    :func:`resolve_rollout_samples` for where it is found.
    """
    if not path or not Path(path).is_file():
        raise MissingInput(
            "no rollout samples: "
            + (
                f"{path} does not exist"
                if path
                else "neither reporting.rollout_samples nor the adapter info names a file"
            )
        )
    samples = pd.read_json(path, lines=True)
    if samples.empty or "step" not in samples:
        raise MissingInput(f"{path} holds no rollout samples with a step")
    text_column = next((c for c in ("workflow_text", "completion", "text") if c in samples), None)
    if text_column is None:
        raise MissingInput(f"{path}: no completion text column")
    steps = sorted(samples["step"].unique())
    early, late = steps[: max(1, len(steps) // 2)], steps[max(1, len(steps) // 2) :] or steps
    parts: list[Any] = []
    for title, chosen in (("Early steps", early[:1]), ("Late steps", late[-1:])):
        rows = samples[samples["step"].isin(chosen)].head(per_phase)
        parts.append(f"### {title} (step {', '.join(str(int(s)) for s in chosen)})")
        for row in rows.to_dict(orient="records"):
            header = []
            if "reward" in row and pd.notna(row["reward"]):
                header.append(f"reward {float(row['reward']):.2f}")
            if "parsed" in row:
                header.append("parsed" if row["parsed"] else "did not parse")
            if row.get("question"):
                header.append(f"question: {str(row['question'])[:160]}")
            parts.append(
                f"*{' · '.join(header)}*\n\n```text\n{str(row[text_column]).strip()[:1500]}\n```"
            )
    return parts


def read_adapter_info(path: str | Path | None) -> dict[str, Any]:
    """What training returned (``conductor_adapter_info``), or ``{}`` when it is missing."""
    try:
        return _read_json(path, "the adapter info")
    except MissingInput:
        return {}


def resolve_rollout_samples(
    explicit: str | Path | None,
    adapter_info: dict[str, Any] | None,
    root: str | Path | None = None,
) -> Path | None:
    """Where the rollout samples are: ``explicit`` (the ``reporting.rollout_samples``
    setting) when given, else the file training recorded in its adapter info
    (``rollout_samples``, ``data/06_models/conductor/runs/<fingerprint>/rollout_samples.jsonl``).

    Training records that path relative to the project root, while the notebook runs in
    ``notebooks/``; a relative path is therefore resolved against ``root`` (default: the
    project root), never the working directory. None when neither names a file."""
    if explicit:
        return Path(explicit)
    recorded = (adapter_info or {}).get("rollout_samples")
    if not recorded:
        return None
    path = Path(recorded)
    if not path.is_absolute():
        if root is None:
            from conductor_pipeline.paths import project_root

            root = project_root()
        path = Path(root) / path
    return path
