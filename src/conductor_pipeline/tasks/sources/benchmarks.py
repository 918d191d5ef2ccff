"""The paper's benchmarks, loaded through Hugging Face ``datasets`` (or from local copies).

Each benchmark has a pure ``<name>_task(row, ...)`` that maps one row of the hub dataset's
schema to a :class:`Task`, and a ``load_<name>(*, split, limit, data_files, seed, ...)``
that fetches the rows and maps them. ``data_files`` (one path or several: ``.jsonl``,
``.json``, ``.parquet`` or ``.csv``) reads a local copy in the hub schema instead of calling
``datasets.load_dataset``; without it, the hub dataset must already be in the Hugging Face
cache when running offline, and a failed load raises ``RuntimeError`` that says so.
``limit`` keeps a seeded sample of that many rows, in source order. ``seed`` also fixes
GPQA's choice order.

Schemas and choices are in each family's module: ``math_benchmarks`` (math500, aime25,
rlpr), ``choice_benchmarks`` (mmlu, gpqa_diamond), ``livecodebench_source`` and
``bigcodebench_source``; rows are read by ``benchmark_rows``. This module registers the
loaders under their configuration names and re-exports the public names.

Code tasks carry ``test_style`` (``check`` for HumanEval-style ``check(candidate)``,
``unittest`` for BigCodeBench, ``stdin`` / ``functional`` per LiveCodeBench test) so the
verifier need not guess.
"""

from __future__ import annotations

from collections.abc import Callable

from conductor_pipeline.tasks.sources.benchmark_rows import (
    CODE_FENCE_INSTRUCTION,
    LETTERS,
    MC_INSTRUCTION,
    DataFiles,
    hub_rows,
    read_local_rows,
)
from conductor_pipeline.tasks.sources.bigcodebench_source import (
    BCB_INSTRUCTION,
    BCB_MEMORY_MB,
    BCB_TIMEOUT_S,
    bigcodebench_task,
    load_bigcodebench,
)
from conductor_pipeline.tasks.sources.choice_benchmarks import (
    gpqa_task,
    load_gpqa_diamond,
    load_mmlu,
    mmlu_task,
)
from conductor_pipeline.tasks.sources.livecodebench_source import (
    LCB_FUNCTIONAL_INSTRUCTION,
    LCB_MAX_DECODED_BYTES,
    LCB_STDIN_INSTRUCTION,
    UnsafeTestData,
    decode_livecodebench_tests,
    livecodebench_files,
    livecodebench_task,
    load_livecodebench,
)
from conductor_pipeline.tasks.sources.math_benchmarks import (
    aime25_task,
    load_aime25,
    load_math500,
    load_rlpr,
    math500_task,
    rlpr_task,
)
from conductor_pipeline.tasks.types import Task

# the drop folder reads LiveCodeBench's hub files through this name
_hub_rows = hub_rows

BENCHMARK_LOADERS: dict[str, Callable[..., list[Task]]] = {
    "math500": load_math500,
    "mmlu": load_mmlu,
    "gpqa_diamond": load_gpqa_diamond,
    "livecodebench": load_livecodebench,
    "aime25": load_aime25,
    "rlpr": load_rlpr,
    "bigcodebench": load_bigcodebench,
}

__all__ = [
    "BCB_INSTRUCTION",
    "BCB_MEMORY_MB",
    "BCB_TIMEOUT_S",
    "BENCHMARK_LOADERS",
    "CODE_FENCE_INSTRUCTION",
    "LCB_FUNCTIONAL_INSTRUCTION",
    "LCB_MAX_DECODED_BYTES",
    "LCB_STDIN_INSTRUCTION",
    "LETTERS",
    "MC_INSTRUCTION",
    "DataFiles",
    "UnsafeTestData",
    "aime25_task",
    "bigcodebench_task",
    "decode_livecodebench_tests",
    "gpqa_task",
    "livecodebench_files",
    "livecodebench_task",
    "load_aime25",
    "load_bigcodebench",
    "load_gpqa_diamond",
    "load_livecodebench",
    "load_math500",
    "load_mmlu",
    "load_rlpr",
    "math500_task",
    "mmlu_task",
    "read_local_rows",
    "rlpr_task",
]
