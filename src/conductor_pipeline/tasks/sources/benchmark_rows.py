"""Rows of a benchmark, from a local copy (``data_files``) or the Hugging Face hub, sampled
down to ``limit`` with a seed; and the pieces of question text the benchmarks share.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from conductor_pipeline.tasks.sources._common import (
    check_limit,
    derived_seed,
    seeded_subset,
)

DataFiles = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

LETTERS = "ABCDEFGHIJ"
MC_INSTRUCTION = "Answer with the letter of the correct choice."
CODE_FENCE_INSTRUCTION = "Reply with the complete code in a single ```python code block."


def read_local_rows(data_files: DataFiles) -> list[dict[str, Any]]:
    """Rows of local ``.jsonl``/``.json``/``.parquet``/``.csv`` files, in order."""
    paths = [data_files] if isinstance(data_files, str | os.PathLike) else list(data_files)
    if not paths:
        raise ValueError("data_files: no file given")
    rows: list[dict[str, Any]] = []
    for raw_path in paths:
        path = Path(raw_path)
        suffix = path.suffix.lower()
        if suffix in {".jsonl", ".json"}:
            rows.extend(_read_json_rows(path))
        elif suffix == ".parquet":
            import pyarrow.parquet as pq

            rows.extend(pq.read_table(path).to_pylist())
        elif suffix == ".csv":
            with path.open(newline="", encoding="utf-8") as handle:
                rows.extend(csv.DictReader(handle))
        else:
            raise ValueError(f"data_files: {path} is not .jsonl, .json, .parquet or .csv")
    return rows


def _read_json_rows(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError:
        # JSON lines (also what Dataset.to_json writes, whatever the file's suffix).
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(loaded, dict):
        loaded = [loaded]
    if not isinstance(loaded, list) or not all(isinstance(row, dict) for row in loaded):
        raise ValueError(
            f"data_files: {path} must hold JSON objects (a list of them or one per line)"
        )
    return loaded


def hub_rows(
    benchmark: str, path: str, *, split: str, name: str | None = None, **kwargs: Any
) -> list[dict[str, Any]]:
    # Imported here: `datasets` is slow to import and only the full-scale profile needs it.
    import datasets

    try:
        loaded = datasets.load_dataset(path, name, split=split, **kwargs)
    except Exception as err:  # offline, not cached, gated, renamed...: all need the same advice
        what = f"{path!r}" + (f" (config {name!r})" if name else "") + f", split {split!r}"
        # `datasets` obeys its own switch before the hub's, so both must be named
        offline = [v for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE") if os.environ.get(v) == "1"]
        switch = (
            f" {' and '.join(offline)}=1 is set (the project is offline by default): export "
            f"{' '.join(v + '=0' for v in offline)} to download it."
            if offline
            else ""
        )
        raise RuntimeError(
            f"{benchmark}: could not load {what} with datasets.load_dataset ({type(err).__name__}: {err}).{switch} "
            f"Download the dataset beforehand so that it is in the Hugging Face cache, "
            f"or pass a local copy in the same schema with data_files=..."
        ) from err
    return loaded.to_list()


def sampled_rows(
    benchmark: str,
    data_files: DataFiles | None,
    hub: Callable[[], list[dict[str, Any]]],
    limit: int | None,
    seed: int,
) -> list[tuple[int, dict[str, Any]]]:
    """(source index, row) pairs, seeded-sampled down to ``limit``."""
    check_limit(limit)
    rows = read_local_rows(data_files) if data_files is not None else hub()
    return [
        (index, rows[index])
        for index in seeded_subset(len(rows), limit, derived_seed(benchmark, seed))
    ]


def mc_question(stem: str, choices: Sequence[str]) -> str:
    listed = "\n".join(f"{LETTERS[i]}) {choice}" for i, choice in enumerate(choices))
    return f"{stem.strip()}\n\n{listed}\n\n{MC_INSTRUCTION}"


def id_part(value: Any) -> str:
    """An id segment: path separators are fine, whitespace is not."""
    return re.sub(r"\s+", "_", str(value).strip())
