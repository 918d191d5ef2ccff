"""How a simulated worker sees the text it was sent: word counts as tokens, and which
prepared tasks occur in it.

A task is found by its question's 6-grams of words and signs (normalised as the data
preparation compares questions, :func:`~conductor_pipeline.tasks.splits.normalise_question`;
:class:`TaskIndex`): it is **visible** when at least 60 % of them occur in the text,
**recognised** (seen, but too garbled to solve) from 20 %. The simulated worker
(:mod:`.simulated`) decides how to answer from that.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from conductor_pipeline.tasks.splits import normalise_question
from conductor_pipeline.tasks.types import Task

NGRAM = 6
VISIBLE_SHARE = 0.6
# Below VISIBLE_SHARE but at least this share: the task is recognised but garbled.
RECOGNISED_SHARE = 0.2
TOKENS_PER_WORD = 1.3
TOKENS_PER_MESSAGE = 3  # role and separators, as chat templates add


def count_tokens(text: str) -> int:
    """A realistic token estimate: about 1.3 tokens per whitespace-separated word."""
    words = len(text.split())
    return math.ceil(words * TOKENS_PER_WORD) if words else 0


def message_text(message: dict[str, Any]) -> str:
    """The text of one chat message; list-of-parts content is joined."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text") or ""))
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return str(content)


def prompt_token_count(messages: Sequence[dict[str, Any]]) -> int:
    return sum(count_tokens(message_text(m)) + TOKENS_PER_MESSAGE for m in messages)


# --- recognising tasks --------------------------------------------------------------------


@dataclass(frozen=True)
class TaskMatch:
    task: Task
    coverage: float  # share of the question's 6-grams found in the text (0..1)

    @property
    def visible(self) -> bool:
        return self.coverage >= VISIBLE_SHARE


class TaskIndex:
    """Finds which prepared tasks a block of text contains.

    Questions and texts are normalised as the data preparation compares questions, and cut
    into 6-grams of words and signs. A question's coverage is the share of its distinct
    6-grams present in the text; a question shorter than six of them counts as covered when
    it occurs whole.

    Lookup is an inverted index over *rare* 6-grams (held by at most ``rare_limit``
    questions); boilerplate shared by many questions only enters the exact coverage count
    of the candidates. Questions made entirely of common 6-grams are few and are checked
    directly.
    """

    def __init__(self, tasks: Iterable[Task], *, rare_limit: int = 32) -> None:
        self._tasks: list[Task] = []
        self._by_id: dict[str, Task] = {}
        self._grams: list[frozenset[int]] = []
        self._short: list[tuple[int, str]] = []  # (task position, " normalised question ")
        postings: dict[int, list[int]] = {}
        for task in tasks:
            if task.id in self._by_id:
                raise ValueError(f"duplicate task id {task.id!r} in the sandbox task set")
            pos = len(self._tasks)
            self._tasks.append(task)
            self._by_id[task.id] = task
            words = normalise_question(task.question).split()
            grams = frozenset(_gram_hashes(words))
            self._grams.append(grams)
            if not grams:
                if words:
                    self._short.append((pos, f" {' '.join(words)} "))
                continue
            for gram in grams:
                postings.setdefault(gram, []).append(pos)
        self._rare: dict[int, tuple[int, ...]] = {
            gram: tuple(holders) for gram, holders in postings.items() if len(holders) <= rare_limit
        }
        rare_holders = {pos for holders in self._rare.values() for pos in holders}
        self._only_common = [
            pos for pos, grams in enumerate(self._grams) if grams and pos not in rare_holders
        ]

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def get(self, task_id: str) -> Task | None:
        return self._by_id.get(task_id)

    def scan(self, text: str, *, min_coverage: float = RECOGNISED_SHARE) -> list[TaskMatch]:
        """Tasks whose coverage in ``text`` is at least ``min_coverage``, best first.

        Ties are broken by longer question (more specific), then by id.
        """
        words = normalise_question(text).split()
        text_grams = set(_gram_hashes(words))
        candidates: set[int] = set(self._only_common)
        for gram in text_grams:
            holders = self._rare.get(gram)
            if holders:
                candidates.update(holders)
        found: list[TaskMatch] = []
        for pos in candidates:
            grams = self._grams[pos]
            coverage = len(grams & text_grams) / len(grams)
            if coverage >= min_coverage and coverage > 0:
                found.append(TaskMatch(self._tasks[pos], coverage))
        if self._short:
            padded = f" {' '.join(words)} "
            for pos, needle in self._short:
                if needle in padded:
                    found.append(TaskMatch(self._tasks[pos], 1.0))
        found.sort(key=lambda m: (-m.coverage, -len(m.task.question), m.task.id))
        return found

    def visible(self, text: str) -> list[Task]:
        """The tasks visible in ``text`` (coverage of at least 60 %), best first."""
        return [m.task for m in self.scan(text, min_coverage=VISIBLE_SHARE)]


def _gram_hashes(words: Sequence[str]) -> list[int]:
    if len(words) < NGRAM:
        return []
    return [hash(" ".join(words[i : i + NGRAM])) for i in range(len(words) - NGRAM + 1)]
