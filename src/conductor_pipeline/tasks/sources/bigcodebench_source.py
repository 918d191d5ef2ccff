"""BigCodeBench: Python tasks that use common libraries, checked by a unittest class.

- ``bigcodebench`` (bigcode/bigcodebench, split = version, default v0.1.4): task_id,
  complete_prompt, instruct_prompt, code_prompt, canonical_solution, test (a unittest
  ``TestCases`` class), entry_point, libs. ``answer`` is complete_prompt plus the canonical
  body; ``variant`` picks the complete or instruct prompt; difficulty from the canonical body
  size (≤10 non-blank lines easy, ≤25 medium, longer hard). Its tasks import numpy, pandas
  and friends, so they run in the code sandbox with the interpreter's site-packages and
  roomier limits (``timeout_s``, ``memory_mb``), still without network.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from conductor_pipeline.tasks.sources.benchmark_rows import (
    CODE_FENCE_INSTRUCTION,
    DataFiles,
    hub_rows,
    id_part,
    sampled_rows,
)
from conductor_pipeline.tasks.types import Task

BCB_INSTRUCTION = (
    "Complete the Python function below so that it does what its docstring describes. "
    + CODE_FENCE_INSTRUCTION
)


BCB_TIMEOUT_S = 60
BCB_MEMORY_MB = 4096


def bigcodebench_task(
    row: Mapping[str, Any],
    *,
    index: int,
    variant: str = "complete",
    timeout_s: float = BCB_TIMEOUT_S,
    memory_mb: int = BCB_MEMORY_MB,
) -> Task:
    if variant not in ("complete", "instruct"):
        raise ValueError(f"bigcodebench: variant must be 'complete' or 'instruct', got {variant!r}")
    prompt = str(row["complete_prompt"])
    body = str(row["canonical_solution"])
    if variant == "complete":
        question = f"{BCB_INSTRUCTION}\n\n```python\n{prompt.rstrip()}\n```"
    else:
        question = f"{str(row['instruct_prompt']).strip()}\n\n{CODE_FENCE_INSTRUCTION}"
    task_id = str(row.get("task_id") or f"row{index}")
    lines = sum(1 for line in body.splitlines() if line.strip())
    return Task(
        id=f"bigcodebench/{id_part(task_id.rsplit('/', 1)[-1])}",
        domain="code",
        difficulty="easy" if lines <= 10 else "medium" if lines <= 25 else "hard",
        question=question,
        answer=prompt + body,
        answer_format="code",
        verifier="code",
        source="bigcodebench",
        metadata={
            "prompt": prompt,
            "test": str(row["test"]),
            "entry_point": str(row.get("entry_point") or "task_func"),
            "task_id": task_id,
            "libs": _libs(row.get("libs")),
            "test_style": "unittest",
            # Its tasks import numpy, pandas, matplotlib...: the sandbox must start with the
            # interpreter's site-packages, and importing those needs more than the
            # HumanEval-sized defaults (seconds of start-up, hundreds of MB mapped).
            "site_packages": True,
            "timeout_s": timeout_s,
            "memory_mb": memory_mb,
        },
    )


def load_bigcodebench(
    *,
    split: str = "v0.1.4",
    limit: int | None = None,
    data_files: DataFiles | None = None,
    seed: int = 0,
    variant: str = "complete",
    timeout_s: float = BCB_TIMEOUT_S,
    memory_mb: int = BCB_MEMORY_MB,
    hub_id: str = "bigcode/bigcodebench",
) -> list[Task]:
    rows = sampled_rows(
        "bigcodebench",
        data_files,
        lambda: hub_rows("bigcodebench", hub_id, split=split),
        limit,
        seed,
    )
    return [
        bigcodebench_task(
            row, index=index, variant=variant, timeout_s=timeout_s, memory_mb=memory_mb
        )
        for index, row in rows
    ]


def _libs(raw: Any) -> list[str]:
    # The hub stores libs as the repr of a list; literal_eval reads literals only, never code.
    if isinstance(raw, str):
        try:
            raw = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            return []
    return [str(lib) for lib in raw] if isinstance(raw, list | tuple) else []
