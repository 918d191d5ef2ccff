"""Task sources: each turns a dataset into a list of :class:`~conductor_pipeline.tasks.types.Task`.

``load_source(name, **options)`` is what configuration-driven callers (the data_prep
pipeline) use; the loaders are importable directly for notebooks and tests.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from conductor_pipeline.config_checks import check_keys
from conductor_pipeline.tasks.sources.benchmarks import (
    BENCHMARK_LOADERS,
    load_aime25,
    load_bigcodebench,
    load_gpqa_diamond,
    load_livecodebench,
    load_math500,
    load_mmlu,
    load_rlpr,
    read_local_rows,
)
from conductor_pipeline.tasks.sources.humaneval_source import load_humaneval
from conductor_pipeline.tasks.sources.reasoning_gym_source import (
    available_datasets,
    load_reasoning_gym,
)
from conductor_pipeline.tasks.types import Task

SOURCES: dict[str, Callable[..., list[Task]]] = {
    "reasoning_gym": load_reasoning_gym,
    "humaneval": load_humaneval,
    **BENCHMARK_LOADERS,
}


def load_source(name: str, **options: Any) -> list[Task]:
    """Load the source registered as ``name`` with ``options`` as keyword arguments.

    Callers pass one pipeline-wide ``seed`` to every source; a source that has no use for a
    seed (HumanEval is a fixed list) simply does not receive it.
    """
    loader = SOURCES.get(name)
    if loader is None:
        raise ValueError(f"unknown task source {name!r}; known: {sorted(SOURCES)}")
    parameters = inspect.signature(loader).parameters
    if "seed" in options and "seed" not in parameters:
        options.pop("seed")
    check_keys(f"source {name!r}", options, (p for p in parameters if p != "self"))
    return loader(**options)


__all__ = [
    "BENCHMARK_LOADERS",
    "SOURCES",
    "available_datasets",
    "load_aime25",
    "load_bigcodebench",
    "load_gpqa_diamond",
    "load_humaneval",
    "load_livecodebench",
    "load_math500",
    "load_mmlu",
    "load_reasoning_gym",
    "load_rlpr",
    "load_source",
    "read_local_rows",
]
