"""Benchmarks with a math or short free-form answer: MATH500, AIME25 and RLPR.

- ``math500`` (HuggingFaceH4/MATH-500, test): problem, solution, answer, subject, level 1-5,
  unique_id. Verifier ``math``; difficulty: levels 1-2 easy, 3 medium, 4-5 hard.
- ``aime25`` (math-ai/aime25, test): problem (or question), answer, id. Integer answers,
  verifier ``math``, difficulty ``hard``.
- ``rlpr`` (openbmb/RLPR-Train-Dataset, train; the verl layout also used by the RLPR test
  sets): prompt (chat messages; the last user message is the question) or a plain string,
  reward_model.ground_truth, data_source, ability, extra_info. Ground truths with digits or
  LaTeX go to the ``math`` verifier, other text to ``exact``; domain ``reasoning``,
  difficulty ``medium``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from conductor_pipeline.tasks.sources._common import (
    json_safe,
    looks_numeric,
)
from conductor_pipeline.tasks.sources.benchmark_rows import (
    DataFiles,
    hub_rows,
    id_part,
    sampled_rows,
)
from conductor_pipeline.tasks.types import Task

# ---------------------------------------------------------------------------- MATH500


def math500_task(row: Mapping[str, Any], *, index: int, split: str = "test") -> Task:
    level = _int_or_none(row.get("level"))
    unique_id = row.get("unique_id")
    key = id_part(unique_id).removesuffix(".json") if unique_id else f"{split}/{index}"
    return Task(
        id=f"math500/{key}",
        domain="math",
        difficulty=_math_level_difficulty(level),
        question=str(row["problem"]),
        answer=str(row["answer"]).strip(),
        answer_format="math",
        verifier="math",
        source="math500",
        metadata=json_safe(
            {
                "subject": row.get("subject"),
                "level": level,
                "unique_id": unique_id,
                "solution": row.get("solution"),
            }
        ),
    )


def load_math500(
    *,
    split: str = "test",
    limit: int | None = None,
    data_files: DataFiles | None = None,
    seed: int = 0,
    hub_id: str = "HuggingFaceH4/MATH-500",
) -> list[Task]:
    rows = sampled_rows(
        "math500", data_files, lambda: hub_rows("math500", hub_id, split=split), limit, seed
    )
    return [math500_task(row, index=index, split=split) for index, row in rows]


def _math_level_difficulty(level: int | None) -> str:
    if level is None:
        return "medium"
    return "easy" if level <= 2 else "medium" if level == 3 else "hard"


def _int_or_none(value: Any) -> int | None:
    # MATH stores levels as ints in MATH-500 and as "Level 3" strings in older copies.
    match = re.search(r"\d+", str(value)) if value is not None else None
    return int(match.group()) if match else None


# ---------------------------------------------------------------------------- AIME25


def aime25_task(row: Mapping[str, Any], *, index: int, split: str = "test") -> Task:
    problem = row.get("problem", row.get("question"))
    if problem is None:
        raise ValueError(f"aime25 row {index}: no 'problem' (or 'question') field")
    key = row.get("id")
    return Task(
        id=f"aime25/{id_part(key)}"
        if key is not None and str(key).strip()
        else f"aime25/{split}/{index}",
        domain="math",
        difficulty="hard",
        question=str(problem),
        answer=str(row["answer"]).strip(),
        answer_format="number",
        verifier="math",
        source="aime25",
        metadata={},
    )


def load_aime25(
    *,
    split: str = "test",
    limit: int | None = None,
    data_files: DataFiles | None = None,
    seed: int = 0,
    hub_id: str = "math-ai/aime25",
    config: str | None = None,
) -> list[Task]:
    rows = sampled_rows(
        "aime25",
        data_files,
        lambda: hub_rows("aime25", hub_id, name=config, split=split),
        limit,
        seed,
    )
    return [aime25_task(row, index=index, split=split) for index, row in rows]


# ---------------------------------------------------------------------------- RLPR

_MATHY = re.compile(r"[\d\\^_{}$=]")


def rlpr_task(row: Mapping[str, Any], *, index: int, split: str = "train") -> Task:
    question = _rlpr_question(row.get("prompt"), where=f"rlpr row {index}")
    reward_model = row.get("reward_model")
    if isinstance(reward_model, str):
        reward_model = json.loads(reward_model)
    if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
        raise ValueError(f"rlpr row {index}: no reward_model.ground_truth")
    truth = str(reward_model["ground_truth"]).strip()
    if looks_numeric(truth):
        answer_format, verifier = "number", "math"
    elif _MATHY.search(truth):
        answer_format, verifier = "math", "math"
    else:
        answer_format, verifier = "text", "exact"
    return Task(
        id=f"rlpr/{split}/{index}",
        domain="reasoning",
        difficulty="medium",
        question=question,
        answer=truth,
        answer_format=answer_format,
        verifier=verifier,
        source="rlpr",
        metadata=json_safe(
            {
                "data_source": row.get("data_source"),
                "ability": row.get("ability"),
                "extra_info": row.get("extra_info") or {},
            }
        ),
    )


def load_rlpr(
    *,
    split: str = "train",
    limit: int | None = None,
    data_files: DataFiles | None = None,
    seed: int = 0,
    hub_id: str = "openbmb/RLPR-Train-Dataset",
    config: str | None = None,
) -> list[Task]:
    rows = sampled_rows(
        "rlpr", data_files, lambda: hub_rows("rlpr", hub_id, name=config, split=split), limit, seed
    )
    return [rlpr_task(row, index=index, split=split) for index, row in rows]


def _rlpr_question(prompt: Any, *, where: str) -> str:
    if isinstance(prompt, str):
        try:
            decoded = json.loads(prompt)
        except ValueError:
            return prompt
        prompt = decoded if isinstance(decoded, list) else prompt
        if isinstance(prompt, str):
            return prompt
    if isinstance(prompt, Iterable):
        # The system message holds RLPR's own answer-format instructions, not the question.
        users = [
            m.get("content") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"
        ]
        if users and str(users[-1]).strip():
            return str(users[-1])
    raise ValueError(f"{where}: prompt has no user message")
