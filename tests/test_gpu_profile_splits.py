"""The GPU profile's data against the paper's (conductor-paper.md, "Data"): the train split
holds 960 problems, 240 a source, and evaluation never reads a benchmark split that
data_prep trains on, unless evaluation drops the questions training saw by design."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from conductor_pipeline.project import load_project_config
from conductor_pipeline.tasks.sources.benchmarks import BENCHMARK_LOADERS
from conductor_pipeline.tasks.splits import balance_domains, split_tasks
from conductor_pipeline.tasks.types import Task

REPO = Path(__file__).resolve().parents[1]
# benchmarks whose one test split the paper divides between training and testing (MATH500
# 300/100; MMLU's test split): evaluation drops every question of the train and validation
# splits (evaluation_questions), so the rest is held out
SHARED_BY_DESIGN = {"math500", "mmlu"}


@pytest.fixture(scope="module")
def gpu() -> dict[str, Any]:
    return load_project_config("gpu", root=REPO).parameters


def _split_read(name: str, options: dict[str, Any]) -> tuple[Any, ...]:
    """What a loader reads for ``options``: its local files, else its hub dataset, config,
    split and version (each option given, else the loader's default)."""
    if options.get("data_files"):
        return ("files", str(options["data_files"]))
    defaults = {
        key: parameter.default
        for key, parameter in inspect.signature(BENCHMARK_LOADERS[name]).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
    keys = ("hub_id", "config", "split", "version")
    return ("hub", *(options.get(key, defaults.get(key)) for key in keys))


def test_evaluation_never_reads_a_split_that_training_draws_from(gpu: dict[str, Any]) -> None:
    trained = {
        name: _split_read(name, dict(options or {}))
        for name, options in gpu["data_prep"]["sources"].items()
    }
    evaluated = gpu["evaluation"]["benchmarks"]
    assert "rlpr" in trained and "rlpr" in evaluated
    shared = {
        name
        for name, options in evaluated.items()
        if name in trained and _split_read(name, dict(options or {})) == trained[name]
    }
    assert shared <= SHARED_BY_DESIGN, (
        f"evaluation reads the split data_prep trains on for {sorted(shared - SHARED_BY_DESIGN)}"
    )


def _tasks(domain: str, n: int) -> list[Task]:
    return [
        Task(
            f"{domain}/{i}",
            domain,
            "medium",
            f"{domain} question {i}?",
            "1",
            "text",
            "exact",
            domain,
        )
        for i in range(n)
    ]


def test_the_train_split_holds_the_papers_960_problems(gpu: dict[str, Any]) -> None:
    prep = gpu["data_prep"]
    quotas = prep["domain_quota"]
    assert len(quotas) == 4
    # every source offers more than its quota (as the hub datasets do)
    pool = [task for domain, quota in quotas.items() for task in _tasks(domain, quota + 50)]
    kept, _ = balance_domains(pool, quotas, seed=prep["seed"])
    splits = split_tasks(kept, prep["split_ratios"], seed=prep["seed"])
    assert len(splits["train"]) == 960
    per_domain = {d: sum(t.domain == d for t in splits["train"]) for d in quotas}
    assert set(per_domain.values()) == {240}
