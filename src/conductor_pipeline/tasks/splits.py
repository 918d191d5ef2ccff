"""Deduplication, per-domain balancing and seeded, stratified train/validation/test splits."""

from __future__ import annotations

import random
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from conductor_pipeline.tasks.types import Task

SPLIT_NAMES = ("train", "validation", "test")

# Characters that render as nothing (zero-width spaces and joiners, soft hyphen, word joiner,
# byte-order mark, bidi and invisible-operator marks, variation selectors, fillers): a
# question with one inserted is the same question.
_INVISIBLE = dict.fromkeys(
    [0x00AD, 0x034F, 0x061C, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFEFF, 0xFFA0]
    + list(range(0x180B, 0x1810))
    + list(range(0x200B, 0x2010))
    + list(range(0x202A, 0x202F))
    + list(range(0x2060, 0x2070))
    + list(range(0xFE00, 0xFE10))
    + list(range(0x1D173, 0x1D17B))
    + list(range(0xE0000, 0xE0080))
)
# Letters that look like Latin ones (lowercase: the text is casefolded first, which maps the
# capitals onto these) and the operator signs written other ways. Our own short table of
# the common lookalikes, not Unicode's full confusables list.
_CONFUSABLES = str.maketrans(
    {
        # Cyrillic
        "а": "a", "в": "b", "е": "e", "һ": "h", "і": "i", "ј": "j", "к": "k", "ӏ": "l",
        "м": "m", "н": "h", "о": "o", "р": "p", "ԛ": "q", "с": "c", "ѕ": "s", "т": "t",
        "у": "y", "ԝ": "w", "х": "x", "ԁ": "d", "ү": "y",
        # Greek
        "α": "a", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t",
        "υ": "u", "χ": "x", "ϲ": "c",
        # minus and the dashes written for it; times; division
        "\u2212": "-", "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-",
        "\u2014": "-", "\u2015": "-", "\u2796": "-",
        "\u00d7": "*", "\u2217": "*", "\u22c5": "*", "\u2715": "*", "\u2716": "*",
        "\u00f7": "/", "\u2215": "/", "\u2044": "/",
    }
)  # fmt: skip
# A word, or one of the signs that change what a question asks ("1 + -5" is not "-(-1 + -5)")
_TOKEN = re.compile(r"\w+|[-+*/^=<>()\[\]{}%]")


def normalise_question(text: str) -> str:
    """The form two questions a person would call the same share, used to spot duplicates.

    NFKC, invisible characters removed, casefolded, accents stripped, common Cyrillic and
    Greek lookalikes and operator variants folded to ASCII; then the words, numbers and
    operator/bracket signs, one space apart (other punctuation and spacing do not count).
    """
    if text.isascii():  # the common case: nothing to fold but case
        return " ".join(_TOKEN.findall(text.lower()))
    text = unicodedata.normalize("NFKC", text).translate(_INVISIBLE).casefold()
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).translate(_CONFUSABLES)
    return " ".join(_TOKEN.findall(text))


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
