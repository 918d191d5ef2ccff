"""Simulated workers: profile-driven stand-ins for LLMs over the prepared task set.

A simulated worker runs no model. It looks for prepared tasks in the text it was sent
(:class:`TaskIndex`), and answers according to its profile:

* the task's question is **visible** (at least 60 % of the question's word 6-grams occur in
  the messages): it solves it with probability ``skill[domain][difficulty]``; failing that,
  if a correct earlier attempt is visible, it adopts it with probability ``verify_skill``;
  otherwise it answers wrong (copying a visible wrong attempt when it fails to spot the
  error);
* the task is only **recognisable** (some of its 6-grams occur, too few to count as
  visible): it has not understood the question and is right only at ``guess_rate``
  (multiple choice: it picks a uniformly random letter);
* **no task** is recognisable: it answers like a model that misunderstood, with a
  plausible but unfounded answer in a format guessed from the text.

Replies are a few sentences of generic reasoning followed by the final answer in the
task's format; wrong answers are made to be verifiably wrong. Everything random comes from
a ``random.Random`` seeded by a hash of (server seed, request seed, worker, messages,
temperature), so a request always gets the same reply.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from conductor_pipeline.tasks.types import Task
from conductor_pipeline.workers.sandbox.profiles import SimulatedProfile

NGRAM = 6
VISIBLE_SHARE = 0.6
# Below VISIBLE_SHARE but at least this share: the task is recognised but garbled.
RECOGNISED_SHARE = 0.2
TOKENS_PER_WORD = 1.3
TOKENS_PER_MESSAGE = 3  # role and separators, as chat templates add

_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)


def normalise_text(text: str) -> str:
    """Lowercase, punctuation replaced by spaces, whitespace collapsed."""
    return " ".join(_NON_WORD.sub(" ", text.lower()).split())


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

    Questions and texts are normalised (:func:`normalise_text`) and cut into word 6-grams.
    A question's coverage is the share of its distinct 6-grams present in the text; a
    question shorter than six words counts as covered when it occurs whole.

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
            words = normalise_text(task.question).split()
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
        words = normalise_text(text).split()
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


# --- answers: extraction, comparison, rendering, corruption -------------------------------

_BOXED = "\\boxed{"
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_IS = re.compile(
    r"\b(?:the\s+)?(?:final\s+)?answer\s+is\s*:?\s*([^\n<]+?)\s*(?:\.(?!\d)|\n|<|$)", re.IGNORECASE
)
_ANSWER_LETTER = re.compile(r"\b(?i:answer)(?:\s+(?i:is))?\s*:?\s*\(?([A-Z])\)?(?![A-Za-z])")
_CODE_BLOCK = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)
_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _boxed_contents(text: str) -> list[str]:
    found = []
    start = text.find(_BOXED)
    while start != -1:
        i = start + len(_BOXED)
        depth = 1
        j = i
        while j < len(text) and depth:
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
            j += 1
        if depth == 0:
            found.append(text[i : j - 1].strip())
        start = text.find(_BOXED, j)
    return found


def extract_attempts(text: str, answer_format: str) -> list[str]:
    """Final answers that earlier attempts in ``text`` put forward for a task of this format."""
    if answer_format == "code":
        return [block.strip("\n") for block in _CODE_BLOCK.findall(text) if block.strip()]
    found: list[str] = []
    found += _boxed_contents(text)
    found += [m.strip() for m in _ANSWER_TAG.findall(text)]
    if answer_format == "letter":
        found += [m.upper() for m in _ANSWER_LETTER.findall(text)]
    else:
        found += [m.strip().rstrip(".") for m in _ANSWER_IS.findall(text)]
    return [a for a in found if a]


def _as_number(text: str) -> float | None:
    cleaned = text.strip().strip("$").replace(",", "").rstrip(".").strip()
    if _NUMBER.match(cleaned):
        try:
            return float(cleaned)
        except ValueError:
            return None
    return None


def _letter(text: str) -> str | None:
    """The option letter in ``C``, ``(C)``, ``C.`` or ``(C) some text``; else ``None``."""
    upper = text.strip().upper()
    cleaned = upper.strip("()[]. ")
    if len(cleaned) == 1 and cleaned in _LETTERS:
        return cleaned
    match = re.match(r"^[(\[]?([A-Z])[)\].:]\s", upper + " ")
    return match.group(1) if match else None


def _normalise_math(text: str) -> str:
    text = text.replace("\\left", "").replace("\\right", "").replace("\\dfrac", "\\frac")
    text = text.replace("\\tfrac", "\\frac").replace("$", "").replace("\\!", "")
    return re.sub(r"\s+", "", text).rstrip(".")


def _normalise_code(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip("\n").splitlines() if line.strip())


def is_correct(task: Task, candidate: str) -> bool:
    """Whether ``candidate`` (an extracted final answer) matches the task's answer.

    A simple comparison for the simulation only; the real verdict is the verifiers'.
    """
    fmt = task.answer_format
    if fmt == "code":
        want = _normalise_code(task.answer)
        return bool(want) and want in _normalise_code(candidate)
    if fmt == "letter":
        return _letter(candidate) is not None and _letter(candidate) == _letter(task.answer)
    got, want = _as_number(candidate), _as_number(task.answer)
    if got is not None and want is not None:
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
    if fmt == "math":
        return _normalise_math(candidate) == _normalise_math(task.answer)
    return " ".join(candidate.lower().split()) == " ".join(task.answer.lower().split())


def letter_count(task: Task) -> int:
    """How many options a multiple-choice task has (metadata ``choices``, else 4)."""
    choices = task.metadata.get("choices")
    count = 4
    if isinstance(choices, list | tuple | dict) and choices:
        count = len(choices)
    elif isinstance(choices, int) and choices > 1:
        count = choices
    right = _letter(task.answer)
    if right is not None:
        count = max(count, _LETTERS.index(right) + 1)
    return min(max(count, 2), len(_LETTERS))


def render_answer(answer_format: str, answer: str) -> str:
    """The closing line(s) of a reply carrying ``answer`` in the task's format."""
    if answer_format == "number":
        return f"The answer is {answer}.\n\\boxed{{{answer}}}"
    if answer_format == "math":
        return f"So the final answer is \\boxed{{{answer}}}"
    if answer_format == "letter":
        return f"Answer: ({_letter(answer) or answer})"
    if answer_format == "code":
        return f"```python\n{answer.strip(chr(10))}\n```"
    return f"<answer>{answer}</answer>"


def _format_like(original: str, value: float) -> str:
    if "." in original or "e" in original.lower():
        decimals = len(original.split(".")[1]) if "." in original else 2
        return f"{value:.{max(decimals, 1)}f}"
    return str(int(value))


def _perturb_number(answer: str, rng: random.Random) -> str:
    """A different number of the same shape: off by a little (small values) or by a
    clear relative margin (large values, which scorers compare with relative tolerance)."""
    value = _as_number(answer)
    assert value is not None
    size = abs(value)
    # the smallest change that no sensible tolerance forgives
    least = 0.02 * size if size > 1000 else 1e-3 * max(1.0, size)
    for _ in range(20):
        kind = rng.choice(("plus", "minus", "double", "tenfold", "half"))
        step = rng.choice((1, 2, 3, 10))
        if size > 1000:
            step = size * rng.choice((0.05, 0.1, 0.25))
        if kind == "plus":
            new = value + step
        elif kind == "minus":
            new = value - step
        elif kind == "double":
            new = value * 2 if value else value + 4
        elif kind == "tenfold":
            new = value * 10 if value else value - 7
        else:
            new = value / 2 if value and float(value / 2).is_integer() else value + 5
        text = _format_like(answer.strip(), new)
        got = _as_number(text)
        if got is not None and abs(got - value) >= least:
            return text
    return _format_like(answer.strip(), value * 2 + 1)


# Word swaps that turn a verbal answer into a clearly different one (both directions).
_FLIP_PAIRS = (
    ("true", "false"),
    ("yes", "no"),
    ("valid", "invalid"),
    ("possible", "impossible"),
    ("knight", "knave"),
    ("knights", "knaves"),
    ("hero", "villain"),
    ("heroes", "villains"),
    ("truthful", "lying"),
    ("odd", "even"),
    ("left", "right"),
    ("up", "down"),
    ("increasing", "decreasing"),
    ("ascending", "descending"),
    ("mother", "father"),
    ("son", "daughter"),
    ("brother", "sister"),
    ("husband", "wife"),
    ("grandmother", "grandfather"),
    ("grandson", "granddaughter"),
    ("aunt", "uncle"),
    ("niece", "nephew"),
)
_FLIPS = {a: b for a, b in _FLIP_PAIRS} | {b: a for a, b in _FLIP_PAIRS}
_WORD = re.compile(r"[A-Za-z]+")
_NUMBER_TOKEN = re.compile(r"-?\d+(?:\.\d+)?")


def _same_case(template: str, word: str) -> str:
    if template.isupper() and len(template) > 1:
        return word.upper()
    if template[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def _drop_item(text: str, rng: random.Random) -> str | None:
    """``[a, b, c]`` or ``a, b, c`` with one item left out; ``None`` if not a flat list."""
    bracketed = text[:1] in "[(" and text[-1:] in "])"
    inner = text[1:-1] if bracketed else text
    if any(ch in inner for ch in "[](){}"):
        return None
    parts = inner.split(",")
    if len(parts) < (2 if bracketed else 3):
        return None
    del parts[rng.randrange(len(parts))]
    joined = ",".join(parts).strip() if not bracketed else ",".join(parts).lstrip()
    return f"{text[0]}{joined}{text[-1]}" if bracketed else joined


def _mutate_text(answer: str, rng: random.Random) -> str:
    """A clearly different answer: a flipped key word, a list with an item missing, a
    changed number, or a misspelt longest word, tried in that order."""
    stripped = answer.strip()
    if not stripped:
        return "unknown"
    if _as_number(stripped) is not None:
        return _perturb_number(stripped, rng)
    flippable = [m for m in _WORD.finditer(stripped) if m.group(0).lower() in _FLIPS]
    if flippable:
        m = rng.choice(flippable)
        swapped = _same_case(m.group(0), _FLIPS[m.group(0).lower()])
        return stripped[: m.start()] + swapped + stripped[m.end() :]
    dropped = _drop_item(stripped, rng)
    if dropped is not None and dropped.strip() and dropped != stripped:
        return dropped
    numbers = list(_NUMBER_TOKEN.finditer(stripped))
    if numbers:
        m = rng.choice(numbers)
        return stripped[: m.start()] + _perturb_number(m.group(0), rng) + stripped[m.end() :]
    words = list(_WORD.finditer(stripped))
    if words:
        m = max(words, key=lambda w: (len(w.group(0)), -w.start()))
        k = m.start() + rng.randrange(len(m.group(0)))
        old = stripped[k].lower()
        new = rng.choice([c for c in "abcdefghijklmnopqrstuvwxyz" if c != old])
        new = new.upper() if stripped[k].isupper() else new
        return stripped[:k] + new + stripped[k + 1 :]
    return stripped + " 1"


def _mutate_math(answer: str, rng: random.Random) -> str:
    stripped = answer.strip()
    if _as_number(stripped) is not None:
        return _perturb_number(stripped, rng)
    runs = list(re.finditer(r"\d+", stripped))
    if runs:
        run = rng.choice(runs)
        bumped = str(int(run.group(0)) + rng.choice((1, 2, 3)))
        return stripped[: run.start()] + bumped + stripped[run.end() :]
    return f"{stripped}+1"


_RETURN = re.compile(r"^(?P<indent>\s*)return\b(?P<expr>.*)$")


def break_code(code: str, rng: random.Random) -> str:
    """A subtly broken copy of ``code`` that fails its tests.

    Every ``return X`` becomes ``return (X) + 1`` (off by one; a type error for
    non-numbers) or ``return None``; code without ``return`` gets an unconditional raise.
    """
    lines = code.strip("\n").split("\n")
    variant = rng.choice(("off_by_one", "none"))
    changed = False
    for i, line in enumerate(lines):
        match = _RETURN.match(line)
        if not match:
            continue
        indent, expr = match.group("indent"), match.group("expr").strip()
        balanced = all(expr.count(a) == expr.count(b) for a, b in ("()", "[]", "{}"))
        if variant == "off_by_one" and expr and balanced and not expr.endswith("\\"):
            lines[i] = f"{indent}return ({expr}) + 1"
        else:
            lines[i] = f"{indent}return None"
        changed = True
    if not changed:
        lines.append("raise NotImplementedError('not finished')")
    return "\n".join(lines)


def wrong_answer(task: Task, rng: random.Random) -> str:
    """A plausible answer in the task's format that is not the right one."""
    fmt = task.answer_format
    if fmt == "letter":
        right = _letter(task.answer)
        options = [c for c in _LETTERS[: letter_count(task)] if c != right]
        return rng.choice(options)
    if fmt == "code":
        return break_code(task.answer, rng)
    if fmt == "number":
        if _as_number(task.answer) is not None:
            return _perturb_number(task.answer, rng)
        return _mutate_text(task.answer, rng)
    if fmt == "math":
        return _mutate_math(task.answer, rng)
    return _mutate_text(task.answer, rng)


# --- reasoning filler ---------------------------------------------------------------------

_OPENERS = {
    "solve": (
        "Let me work through this carefully.",
        "I will tackle the subtask directly.",
        "Here is how I approach it.",
    ),
    "confirm": (
        "An earlier step already proposed an answer, so I re-derived it independently.",
        "I checked the previous attempt against my own working and they agree.",
    ),
    "fix": (
        "The earlier attempt contains a slip, so I redid that part myself.",
        "I do not agree with the previous answer; recomputing gives something else.",
    ),
    "adopt": (
        "The earlier attempt looks sound; I retraced its key steps and they hold up.",
        "Checking the proposed answer against the question, it is consistent.",
    ),
    "copy": (
        "The previous attempt seems reasonable, so I build on it.",
        "I follow the line of reasoning already given above.",
    ),
    "wrong": (
        "Let me work through this carefully.",
        "Here is how I approach it.",
        "I will tackle the subtask directly.",
    ),
    "garbled": (
        "Some details of the problem seem to be missing, so I fill the gaps as best I can.",
        "The statement is a little unclear to me; I go with the most likely reading.",
    ),
    "confused": (
        "I am not sure what exactly is being asked, so I make a reasonable assumption.",
        "The request is not entirely clear; here is my best interpretation.",
    ),
}
_GENERIC = (
    "First I pin down what the question actually asks for.",
    "Splitting the problem into smaller parts makes each one easy to check.",
    "The relevant quantities are given in the statement.",
    "Writing the relationships out shows which values depend on which.",
    "There is a tempting shortcut, but being explicit is safer.",
    "Each intermediate result has to respect the stated conditions.",
    "A quick check of the size of the result helps to catch slips.",
    "An alternative route leads to the same place, which is reassuring.",
    "Edge cases deserve a moment before committing to an answer.",
    "Nothing suggests a trick, so the direct route should work.",
    "Keeping signs and units straight avoids the usual mistakes.",
    "Now the partial results can be put together.",
    "I go over the steps once more to make sure none was skipped.",
    "The constraints narrow the possibilities down quickly.",
    "Only one candidate survives all of the checks.",
)
_DOMAIN = {
    "math": (
        "Simplifying before substituting numbers keeps the arithmetic small.",
        "The calculation is short once the expression is set up.",
    ),
    "logic": (
        "Listing the cases and ruling out the impossible ones narrows it down.",
        "Each statement restricts which arrangements remain consistent.",
    ),
    "algorithmic": (
        "Tracing the procedure by hand on the given input settles it.",
        "Following the rule step by step gives the sequence of states.",
    ),
    "code": (
        "The function must also behave sensibly on empty input.",
        "A single pass over the input is enough here.",
    ),
}


def _reasoning(rng: random.Random, mode: str, domain: str, mean_words: float) -> str:
    target = max(4, round(mean_words * rng.uniform(0.6, 1.4)))
    sentences = [rng.choice(_OPENERS[mode])]
    pool = list(_GENERIC) + list(_DOMAIN.get(domain, ())) * 2
    distinct = len(set(pool))
    words = len(sentences[0].split())
    while words < target:
        sentence = rng.choice(pool)
        if sentence in sentences and len(set(sentences) & set(pool)) < distinct:
            continue  # no repeats until every sentence has been used once
        sentences.append(sentence)
        words += len(sentence.split())
    return " ".join(sentences)


# --- the worker ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SimulatedReply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    finish_reason: str
    # what happened, for tests and debugging (not sent to clients)
    mode: str  # solve | confirm | fix | adopt | copy | wrong | garbled | confused
    task_id: str | None
    correct: bool | None  # None when no task was recognised


class SimulatedWorker:
    """One simulated worker: a profile plus the index of the tasks it can recognise."""

    def __init__(
        self, profile: SimulatedProfile, task_index: TaskIndex, *, base_seed: int = 0
    ) -> None:
        self.profile = profile
        self.index = task_index
        self.base_seed = int(base_seed)

    @property
    def name(self) -> str:
        return self.profile.name

    def _rng(
        self, messages: Sequence[dict[str, Any]], seed: int, temperature: float
    ) -> random.Random:
        payload = json.dumps(
            [
                self.base_seed,
                int(seed),
                self.profile.name,
                [[m.get("role", ""), message_text(m)] for m in messages],
                round(float(temperature), 6),
            ],
            ensure_ascii=False,
        )
        digest = hashlib.sha256(payload.encode("utf-8")).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))

    def respond(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        seed: int = 0,
        temperature: float = 1.0,
        max_tokens: int | None = None,
    ) -> SimulatedReply:
        rng = self._rng(messages, seed, temperature)
        text = "\n\n".join(message_text(m) for m in messages)
        matches = self.index.scan(text)
        best = matches[0] if matches else None

        task: Task | None = best.task if best else None
        correct: bool | None = None
        if best is not None and best.visible:
            final, mode, correct = self._answer_visible(best.task, text, rng)
        elif best is not None:
            final, mode, correct = self._answer_garbled(best.task, rng)
        else:
            final, mode = self._answer_confused(text, rng), "confused"

        domain = task.domain if task else ""
        body = _reasoning(rng, mode, domain, self.profile.mean_words)
        reply = f"{body}\n\n{final}"
        completion_tokens = count_tokens(reply)
        finish_reason = "stop"
        if max_tokens is not None and completion_tokens > max_tokens:
            reply = _truncate_words(reply, int(max_tokens / TOKENS_PER_WORD))
            completion_tokens = min(count_tokens(reply), max_tokens)
            finish_reason = "length"
            if task is not None and correct and not _still_has_answer(task, reply):
                correct = False
        latency = self.profile.latency
        wait = latency.median_s
        if latency.sigma > 0 and latency.median_s > 0:
            wait = rng.lognormvariate(math.log(latency.median_s), latency.sigma)
        wait += latency.per_output_token_s * completion_tokens
        return SimulatedReply(
            text=reply,
            prompt_tokens=prompt_token_count(messages),
            completion_tokens=completion_tokens,
            latency_s=wait,
            finish_reason=finish_reason,
            mode=mode,
            task_id=task.id if task else None,
            correct=correct,
        )

    def reply(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        seed: int = 0,
        temperature: float = 1.0,
        max_tokens: int | None = None,
    ) -> tuple[str, int, int, float]:
        """``(text, prompt_tokens, completion_tokens, simulated_latency_s)``."""
        r = self.respond(messages, seed=seed, temperature=temperature, max_tokens=max_tokens)
        return r.text, r.prompt_tokens, r.completion_tokens, r.latency_s

    # -- decisions --

    def _answer_visible(self, task: Task, text: str, rng: random.Random) -> tuple[str, str, bool]:
        # Earlier attempts: answers put forward in the text, outside the question itself.
        attempts = extract_attempts(text.replace(task.question, " "), task.answer_format)
        right = [a for a in attempts if is_correct(task, a)]
        wrong = [a for a in attempts if not is_correct(task, a)]
        solved = rng.random() < self.profile.skill_for(task.domain, task.difficulty)
        checked = rng.random() < self.profile.verify_skill
        fmt = task.answer_format
        if solved:
            mode = "solve" if not attempts else ("confirm" if right else "fix")
            return render_answer(fmt, task.answer), mode, True
        if right and checked:
            return render_answer(fmt, task.answer), "adopt", True
        if wrong and not checked:
            copied = Counter(wrong).most_common(1)[0][0]
            return render_answer(fmt, copied), "copy", False
        return render_answer(fmt, wrong_answer(task, rng)), "wrong", False

    def _answer_garbled(self, task: Task, rng: random.Random) -> tuple[str, str, bool]:
        fmt = task.answer_format
        if fmt == "letter":
            pick = rng.choice(_LETTERS[: letter_count(task)])
            return render_answer(fmt, pick), "garbled", pick == _letter(task.answer)
        if rng.random() < self.profile.guess_rate:
            return render_answer(fmt, task.answer), "garbled", True
        return render_answer(fmt, wrong_answer(task, rng)), "garbled", False

    def _answer_confused(self, text: str, rng: random.Random) -> str:
        if "```" in text or re.search(r"\bdef \w+\(", text):
            name = (re.findall(r"\bdef (\w+)\(", text) or ["solution"])[-1]
            return render_answer("code", f"def {name}(*args):\n    return None")
        if re.search(r"\(([A-D])\)", text):
            return render_answer("letter", rng.choice("ABCD"))
        if "<answer>" in text.lower():
            return render_answer("text", str(rng.randint(0, 99)))
        return render_answer("number", str(rng.randint(0, 120)))


def _truncate_words(text: str, words: int) -> str:
    if words <= 0:
        return ""
    for i, match in enumerate(re.finditer(r"\S+", text)):
        if i == words - 1:
            return text[: match.end()]
    return text


def _still_has_answer(task: Task, text: str) -> bool:
    return any(is_correct(task, a) for a in extract_attempts(text, task.answer_format))
