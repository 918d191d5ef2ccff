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


def _rollout_steps(text: str, worker_names: list[str] | None) -> tuple[list[dict], str]:
    """The steps of a sampled completion for :func:`~.examples.workflow_block` (workers by
    name where the names are known), or no steps and why it did not parse."""
    from conductor_pipeline.workflow import WorkflowParseError, parse_workflow

    names = list(worker_names or [])
    try:
        workflow = parse_workflow(text, len(names) or 1000)
    except WorkflowParseError as err:
        return [], f"The completion is not a workflow: {err}"
    steps = [
        {
            "worker": names[step.worker] if step.worker < len(names) else f"worker {step.worker}",
            "access": "all" if step.all_access and step.access else list(step.access),
            "subtask": step.subtask,
        }
        for step in workflow.steps
    ]
    return steps, ""


def rollout_examples(
    path: str | Path | None, per_phase: int = 3, worker_names: list[str] | None = None
) -> list[Any]:
    """Sample workflows from the earliest and the latest logged steps, each a readable
    block: reward and whether it parsed, the question, then each step's worker (named from
    ``worker_names``, the pool in training order), subtask and what it sees.

    Reads the JSONL file of rollout samples training writes (``step``, ``completion`` or
    ``workflow_text``, optional ``reward``, ``parsed``, ``question``); see
    :func:`resolve_rollout_samples` for where it is found.
    """
    from conductor_pipeline.reporting.examples import workflow_block

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
        for number, row in enumerate(rows.to_dict(orient="records"), start=1):
            facts = []
            if "reward" in row and pd.notna(row["reward"]):
                facts.append(f"reward {float(row['reward']):.2f}")
            if "parsed" in row:
                facts.append("parsed" if row["parsed"] else "did not parse")
            workflow, why = _rollout_steps(str(row[text_column]), worker_names)
            parts.append(
                workflow_block(
                    f"Sample {number}",
                    facts,
                    str(row.get("question") or ""),
                    workflow,
                    remark=why,
                )
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
