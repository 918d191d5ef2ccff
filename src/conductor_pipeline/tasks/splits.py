"""Deduplication, per-domain balancing and seeded, stratified train/validation/test splits."""

from __future__ import annotations

import random
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from conductor_pipeline.tasks.types import Task

SPLIT_NAMES = ("train", "validation", "test")

_NON_WORD = re.compile(r"[^\w]+", re.UNICODE)


def normalise_question(text: str) -> str:
    """Case-, accent-, punctuation- and whitespace-insensitive form used to spot duplicates."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    return _NON_WORD.sub(" ", text.casefold()).strip()


def deduplicate(tasks: Iterable[Task]) -> tuple[list[Task], list[tuple[str, str]]]:
    """Keep the first task of every normalised question.

    Returns the kept tasks and ``(dropped_id, kept_id)`` pairs, so a report can say what
    went where. Deduplicating before splitting is what keeps a question out of two splits.
    """
    first_by_text: dict[str, Task] = {}
    kept: list[Task] = []
    dropped: list[tuple[str, str]] = []
    seen_ids: set[str] = set()
    for task in tasks:
        if task.id in seen_ids:
            raise ValueError(f"duplicate task id {task.id!r}: two sources produced the same id")
        seen_ids.add(task.id)
        key = normalise_question(task.question)
        if key in first_by_text:
            dropped.append((task.id, first_by_text[key].id))
            continue
        first_by_text[key] = task
        kept.append(task)
    return kept, dropped


def _allocate(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Split ``total`` into integer parts proportional to ``weights`` (largest remainder)."""
    weight_sum = sum(weights.values())
    exact = {name: total * w / weight_sum for name, w in weights.items()}
    parts = {name: int(value) for name, value in exact.items()}
    leftover = total - sum(parts.values())
    # ties broken by name order so that the result never depends on dict order
    by_remainder = sorted(exact, key=lambda name: (-(exact[name] - parts[name]), name))
    for name in by_remainder[:leftover]:
        parts[name] += 1
    return parts


def _strata(tasks: Sequence[Task]) -> dict[tuple[str, str], list[Task]]:
    groups: dict[tuple[str, str], list[Task]] = defaultdict(list)
    for task in sorted(tasks, key=lambda t: t.id):
        groups[(task.domain, task.difficulty)].append(task)
    return dict(sorted(groups.items()))


def balance_domains(
    tasks: Sequence[Task], quota: Mapping[str, int | None], *, seed: int
) -> tuple[list[Task], dict[str, dict[str, int]]]:
    """Sample at most ``quota[domain]`` tasks per domain, keeping its difficulty mix.

    A domain absent from ``quota`` or with quota ``None`` keeps all its tasks. Returns the
    sample and, per domain, how many were available and kept.
    """
    rng = random.Random(seed)
    by_domain: dict[str, list[Task]] = defaultdict(list)
    for task in tasks:
        by_domain[task.domain].append(task)
    chosen: list[Task] = []
    report: dict[str, dict[str, int]] = {}
    for domain in sorted(by_domain):
        pool = by_domain[domain]
        limit = quota.get(domain)
        if limit is None or limit >= len(pool):
            kept = sorted(pool, key=lambda t: t.id)
        else:
            strata = _strata(pool)
            shares = _allocate(limit, {f"{d}|{k}": len(v) for (d, k), v in strata.items()})
            kept = []
            for (d, k), members in strata.items():
                kept.extend(rng.sample(members, shares[f"{d}|{k}"]))
        chosen.extend(kept)
        report[domain] = {"available": len(pool), "kept": len(kept)}
    return chosen, report


def split_tasks(
    tasks: Sequence[Task], ratios: Mapping[str, float], *, seed: int
) -> dict[str, list[Task]]:
    """Seeded split stratified by (domain, difficulty), so every split sees the same mix.

    ``ratios`` maps each of ``SPLIT_NAMES`` to a share; shares must sum to 1.
    """
    missing = set(SPLIT_NAMES) - set(ratios)
    if missing:
        raise ValueError(f"split ratios lack {sorted(missing)}")
    rng = random.Random(seed)
    splits: dict[str, list[Task]] = {name: [] for name in SPLIT_NAMES}
    for members in _strata(tasks).values():
        shuffled = list(members)
        rng.shuffle(shuffled)
        counts = _allocate(len(shuffled), {name: ratios[name] for name in SPLIT_NAMES})
        start = 0
        for name in SPLIT_NAMES:
            splits[name].extend(shuffled[start : start + counts[name]])
            start += counts[name]
    return {name: sorted(members, key=lambda t: t.id) for name, members in splits.items()}
