"""Is a new question one of the evaluation questions, perhaps in disguise?

Training on a validation or test question (sent as traffic with a reference answer, dropped
into the drop folder, or published again) would inflate the figures the promotion gates
read. :class:`EvaluationIndex` holds every evaluation split's questions and answers that
question for the growing sources (``tasks.sources.traffic``, ``tasks.sources.growing``,
which also checks the drop folder and LiveCodeBench). Two questions match when:

- their :func:`~conductor_pipeline.tasks.splits.normalise_question` forms are equal (this
  sees through case, spacing, punctuation, accents, zero-width characters and Cyrillic or
  Greek lookalike letters), or
- they are near duplicates: the same numbers and operators in the same order (so
  "Calculate -5 + -5." and "Calculate -6 + -5." stay apart, however alike their text) and
  a character n-gram containment at or above the configured threshold (the question
  quoted inside a longer message, a word added, a small edit of a long question).

Containment is the share of the shorter question's n-grams found in the other one: a
question quoted inside a longer message still matches. Candidates are compared only with
evaluation questions that share one of their rarest n-grams (see :class:`EvaluationIndex`),
so the check stays cheap for large splits.

This module imports neither Kedro nor MLflow.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from conductor_pipeline.tasks.splits import normalise_question

# Character n-gram length: 3 keeps a one-word edit in a short question at a few n-grams
NGRAM = 3
# Above the highest containment between two distinct questions of the sandbox task table
# with the same numbers and operators (0.98: "Spell this word backward ... wig" / "... wir",
# templated questions that differ in one short word): a lower default would flag such
# questions. It still catches a question quoted inside a longer message (1.0) and small
# edits of a long one.
DEFAULT_SIMILARITY_THRESHOLD = 0.99
_NUMBER_OR_OPERATOR = re.compile(r"\d+|[-+*/^=<>()\[\]{}%]")


def signs(key: str) -> tuple[str, ...]:
    """The numbers and operators of a normalised question, in order: two questions that
    differ there ask different things, however alike their words."""
    return tuple(_NUMBER_OR_OPERATOR.findall(key))


def char_ngrams(key: str, n: int = NGRAM) -> frozenset[str]:
    """The character n-grams of a normalised question (the whole text if shorter)."""
    if len(key) <= n:
        return frozenset([key])
    return frozenset(key[i : i + n] for i in range(len(key) - n + 1))


def containment(first: frozenset[str], second: frozenset[str]) -> float:
    """The share of the smaller n-gram set found in the other (1.0: one holds the other)."""
    smaller = min(len(first), len(second))
    return len(first & second) / smaller if smaller else 0.0


@dataclass(frozen=True)
class Match:
    """An evaluation question a new question matched: its split, text and similarity
    (1.0 for an equal normalised form)."""

    split: str
    question: str
    similarity: float
    exact: bool


def check_threshold(value: object, where: str) -> float:
    """A similarity threshold, validated: a number in (0, 1]; the error names ``where``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(
            f"{where}: must be a number in (0, 1] (1 keeps only equal normalised questions "
            f"out), got {value!r}"
        )
    return float(value)


class EvaluationIndex:
    """Every evaluation split's questions, for :meth:`match` (see the module docstring).

    Near duplicates are found without comparing with every question (prefix filtering):
    when the smaller of two n-gram sets has at least ``threshold`` of its n-grams in the
    other, one of its few rarest n-grams is shared. So a question is compared only with the
    entries that hold one of its rarest n-grams or whose rarest n-grams it holds.
    """

    def __init__(
        self,
        splits: Mapping[str, Iterable[str]],
        *,
        threshold: float = DEFAULT_SIMILARITY_THRESHOLD,
    ) -> None:
        self.threshold = check_threshold(threshold, "similarity threshold")
        self._exact: dict[str, tuple[str, str]] = {}
        # (n-grams, numbers and operators, split, question)
        self._entries: list[tuple[frozenset[str], tuple[str, ...], str, str]] = []
        for split, questions in splits.items():
            for question in questions:
                key = normalise_question(str(question))
                if key in self._exact:
                    continue
                self._exact[key] = (split, str(question))
                self._entries.append((char_ngrams(key), signs(key), split, str(question)))
        self._frequency: Counter[str] = Counter(
            gram for grams, *_ in self._entries for gram in grams
        )
        self._holding: dict[str, list[int]] = defaultdict(list)  # n-gram -> entries with it
        self._rarest: dict[str, list[int]] = defaultdict(list)  # n-gram -> entries' prefixes
        for number, (grams, *_) in enumerate(self._entries):
            for gram in grams:
                self._holding[gram].append(number)
            for gram in self._prefix(grams):
                self._rarest[gram].append(number)

    def _prefix(self, grams: frozenset[str]) -> list[str]:
        """The rarest n-grams of a set, as many as one near duplicate must share."""
        size = len(grams)
        length = size - math.ceil(self.threshold * size - 1e-9) + 1
        return sorted(grams, key=lambda gram: (self._frequency.get(gram, 0), gram))[:length]

    def __len__(self) -> int:
        return len(self._exact)

    def match(self, question: str) -> Match | None:
        """The evaluation question ``question`` is the same as or near, else None."""
        key = normalise_question(question)
        found = self._exact.get(key)
        if found is not None:
            return Match(split=found[0], question=found[1], similarity=1.0, exact=True)
        if self.threshold >= 1.0:
            return None
        grams, question_signs = char_ngrams(key), signs(key)
        candidates: set[int] = set()
        for gram in self._prefix(grams):
            candidates.update(self._holding.get(gram, ()))
        for gram in grams:
            candidates.update(self._rarest.get(gram, ()))
        best: Match | None = None
        for number in sorted(candidates):
            other, other_signs, split, text = self._entries[number]
            if other_signs != question_signs:
                continue
            similarity = containment(grams, other)
            if similarity >= self.threshold and (best is None or similarity > best.similarity):
                best = Match(split=split, question=text, similarity=similarity, exact=False)
        return best

    def __contains__(self, question: object) -> bool:
        return isinstance(question, str) and self.match(question) is not None


def evaluation_index(
    questions: EvaluationIndex | Mapping[str, Iterable[str]] | Iterable[str],
    *,
    threshold: float = DEFAULT_SIMILARITY_THRESHOLD,
) -> EvaluationIndex:
    """An index from what a caller holds: an index (as is), questions by split, or the
    questions of one split (named ``test``)."""
    if isinstance(questions, EvaluationIndex):
        return questions
    if isinstance(questions, Mapping):
        return EvaluationIndex(questions, threshold=threshold)
    return EvaluationIndex({"test": questions}, threshold=threshold)
