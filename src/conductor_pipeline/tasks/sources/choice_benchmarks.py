"""Multiple-choice benchmarks: MMLU and GPQA Diamond.

- ``mmlu`` (cais/mmlu, config ``all``, test): question, subject, choices (4), answer (0-3 or
  a letter). Verifier ``multiple_choice``; domain ``knowledge``; difficulty ``medium`` (no
  per-item signal).
- ``gpqa_diamond`` (Idavidrein/gpqa, config ``gpqa_diamond``, train — its only split):
  Question, Correct Answer, Incorrect Answer 1-3, Record ID, Subdomain, High-level domain,
  Writer's Difficulty Estimate. The four options are shuffled with a generator seeded by
  (seed, record), so an order depends on neither row position nor ``limit``; domain
  ``science``; difficulty from the writer's estimate (easy undergraduate → easy, hard
  undergraduate → medium, graduate and beyond or missing → hard).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from conductor_pipeline.tasks.sources._common import (
    derived_seed,
)
from conductor_pipeline.tasks.sources.benchmark_rows import (
    LETTERS,
    DataFiles,
    hub_rows,
    id_part,
    mc_question,
    sampled_rows,
)
from conductor_pipeline.tasks.types import Task

# ---------------------------------------------------------------------------- MMLU


def mmlu_task(row: Mapping[str, Any], *, index: int, split: str = "test") -> Task:
    choices = [str(choice) for choice in row["choices"]]
    gold = _gold_index(row["answer"], len(choices), where=f"mmlu row {index}")
    return Task(
        id=f"mmlu/{split}/{index}",
        domain="knowledge",
        difficulty="medium",
        question=mc_question(str(row["question"]), choices),
        answer=LETTERS[gold],
        answer_format="letter",
        verifier="multiple_choice",
        source="mmlu",
        metadata={"choices": choices, "subject": str(row.get("subject") or "")},
    )


def load_mmlu(
    *,
    split: str = "test",
    limit: int | None = None,
    data_files: DataFiles | None = None,
    seed: int = 0,
    hub_id: str = "cais/mmlu",
    config: str = "all",
) -> list[Task]:
    rows = sampled_rows(
        "mmlu", data_files, lambda: hub_rows("mmlu", hub_id, name=config, split=split), limit, seed
    )
    return [mmlu_task(row, index=index, split=split) for index, row in rows]


def _gold_index(answer: Any, n_choices: int, *, where: str) -> int:
    if isinstance(answer, str) and answer.strip().upper() in LETTERS[:n_choices] and answer.strip():
        return LETTERS.index(answer.strip().upper())
    try:
        gold = int(answer)
    except (TypeError, ValueError):
        raise ValueError(
            f"{where}: answer {answer!r} is neither a choice index nor a letter"
        ) from None
    if not 0 <= gold < n_choices:
        raise ValueError(f"{where}: answer index {gold} outside the {n_choices} choices")
    return gold


# ---------------------------------------------------------------------------- GPQA


def gpqa_task(row: Mapping[str, Any], *, index: int, seed: int = 0) -> Task:
    correct = _clean(row["Correct Answer"])
    options = [correct] + [_clean(row[f"Incorrect Answer {i}"]) for i in (1, 2, 3)]
    record = row.get("Record ID") or f"row{index}"
    # Seeded by the record, not the position, so the order survives sampling and reordering.
    order = list(range(len(options)))
    random.Random(derived_seed("gpqa", seed, record)).shuffle(order)
    choices = [options[i] for i in order]
    gold = order.index(0)
    return Task(
        id=f"gpqa_diamond/{id_part(record)}",
        domain="science",
        difficulty=_gpqa_difficulty(row.get("Writer's Difficulty Estimate")),
        question=mc_question(_clean(row["Question"]), choices),
        answer=LETTERS[gold],
        answer_format="letter",
        verifier="multiple_choice",
        source="gpqa_diamond",
        metadata={
            "choices": choices,
            "record_id": str(record),
            "subdomain": str(row.get("Subdomain") or ""),
            "high_level_domain": str(row.get("High-level domain") or ""),
        },
    )


def load_gpqa_diamond(
    *,
    split: str = "train",
    limit: int | None = None,
    data_files: DataFiles | None = None,
    seed: int = 0,
    hub_id: str = "Idavidrein/gpqa",
    config: str = "gpqa_diamond",
) -> list[Task]:
    rows = sampled_rows(
        "gpqa_diamond",
        data_files,
        lambda: hub_rows("gpqa_diamond", hub_id, name=config, split=split),
        limit,
        seed,
    )
    return [gpqa_task(row, index=index, seed=seed) for index, row in rows]


def _clean(text: Any) -> str:
    # GPQA's CSV-born fields carry stray surrounding whitespace and newlines.
    return str(text).strip()


def _gpqa_difficulty(estimate: Any) -> str:
    text = str(estimate or "").lower()
    if text.startswith("easy undergraduate"):
        return "easy"
    if text.startswith("hard undergraduate"):
        return "medium"
    return "hard"
