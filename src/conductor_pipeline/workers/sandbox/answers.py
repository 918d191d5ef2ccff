"""Answers in the simulation: the final answers earlier attempts put forward, whether one
matches a task's answer, the closing line that carries an answer in the task's format, and
wrong answers made to be verifiably wrong (a perturbed number, a flipped word, code that
returns something else).

The comparison is the simulation's own and deliberately simple; the verdict the pipeline
scores is the verifiers' (:mod:`conductor_pipeline.tasks`).
"""

from __future__ import annotations

import math
import random
import re

from conductor_pipeline.tasks.types import Task

_BOXED = "\\boxed{"
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_IS = re.compile(
    r"\b(?:the\s+)?(?:final\s+)?answer\s+is\s*:?\s*([^\n<]+?)\s*(?:\.(?!\d)|\n|<|$)", re.IGNORECASE
)
_ANSWER_LETTER = re.compile(r"\b(?i:answer)(?:\s+(?i:is))?\s*:?\s*\(?([A-Z])\)?(?![A-Za-z])")
_CODE_BLOCK = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)
_NUMBER = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


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


def option_letter(text: str) -> str | None:
    """The option letter in ``C``, ``(C)``, ``C.`` or ``(C) some text``; else ``None``."""
    upper = text.strip().upper()
    cleaned = upper.strip("()[]. ")
    if len(cleaned) == 1 and cleaned in LETTERS:
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
        return option_letter(candidate) is not None and option_letter(candidate) == option_letter(
            task.answer
        )
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
    right = option_letter(task.answer)
    if right is not None:
        count = max(count, LETTERS.index(right) + 1)
    return min(max(count, 2), len(LETTERS))


def render_answer(answer_format: str, answer: str) -> str:
    """The closing line(s) of a reply carrying ``answer`` in the task's format."""
    if answer_format == "number":
        return f"The answer is {answer}.\n\\boxed{{{answer}}}"
    if answer_format == "math":
        return f"So the final answer is \\boxed{{{answer}}}"
    if answer_format == "letter":
        return f"Answer: ({option_letter(answer) or answer})"
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


# tries at a wrong answer that a task's own scorer rejects (below)
_WRONG_TRIES = 20


def wrong_answer(task: Task, rng: random.Random) -> str:
    """A plausible answer in the task's format that is not the right one.

    A reasoning-gym task is judged by its own scorer, which can accept more than the
    reference answer (a propositional-logic question has several valid conclusions, so
    "not R" may be as right as "not Q"): for those a candidate the real verifier accepts
    is drawn again, so that a wrong answer of the simulation is wrong in the pipeline's
    verdict too."""
    if task.verifier != "reasoning_gym":
        return _wrong_candidate(task, rng)
    from conductor_pipeline.tasks.verifiers import verify

    for _ in range(_WRONG_TRIES):
        candidate = _wrong_candidate(task, rng)
        if not verify(task, render_answer(task.answer_format, candidate)).correct:
            return candidate
    return "no answer"


def _wrong_candidate(task: Task, rng: random.Random) -> str:
    fmt = task.answer_format
    if fmt == "letter":
        right = option_letter(task.answer)
        options = [c for c in LETTERS[: letter_count(task)] if c != right]
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
