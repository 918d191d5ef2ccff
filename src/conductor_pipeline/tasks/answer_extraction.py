"""Read the final answer out of a model's free-text response.

``extract_final_answer(response, answer_format)`` is shared by the verifiers, the simulated
workers and evaluation, so that a reply is read the same way wherever it is judged: the last
``\\boxed{}``, an "the answer is …" or "Answer:" marker, or the last line or number, tidied of
LaTeX wrappers and trailing punctuation. ``extract_code`` and ``extract_letter`` read code
blocks and multiple-choice letters.
"""

from __future__ import annotations

import re

__all__ = [
    "DEFAULT_LETTERS",
    "MAX_ANSWER_CHARS",
    "MAX_RESPONSE_CHARS",
    "NUMBER",
    "boxed_or_marked",
    "extract_code",
    "extract_final_answer",
    "extract_letter",
    "last_boxed",
    "last_line",
    "strip_reasoning",
    "tidy",
]

DEFAULT_LETTERS = "ABCDEFGHIJ"
# Only the tail of very long responses is searched: the final answer is at the end, and
# regexes and sympy on megabytes of degenerate text would stall an RL rollout.
MAX_RESPONSE_CHARS = 100_000
# Longer "answers" are not answers; this also keeps sympy away from pathological input.
MAX_ANSWER_CHARS = 1_000


def extract_final_answer(response: str, answer_format: str) -> str | None:
    """The final answer stated in ``response``, as text, or None when there is none.

    ``number``/``math``: last ``\\boxed{}``, else the last "answer is X" / "Answer: X",
    else (math) the last inline ``$...$`` of the final line, else the last number.
    ``letter``: see ``extract_letter``. ``text``: boxed, else answer markers, else the last
    non-empty line. ``code``: the last fenced Python block (see ``extract_code``).
    """
    if not isinstance(response, str):
        return None
    text = strip_reasoning(response[-MAX_RESPONSE_CHARS:])
    if not text.strip():
        return None
    if answer_format == "letter":
        return extract_letter(text)
    if answer_format == "code":
        return extract_code(text) or None
    answer = boxed_or_marked(text)
    if answer is None:
        if answer_format == "text":
            answer = last_line(text)
        elif answer_format == "math":
            answer = (
                _last_inline_math(last_line(text) or "")
                or _bare_expression(text)
                or _last_number(text)
            )
        else:
            answer = _last_number(text)
    if answer is None:
        return None
    answer = tidy(answer)
    return answer[:MAX_ANSWER_CHARS] if answer else None


_LATEX_OR_MATH = re.compile(r"^[\\\w{}()\[\]^_+\-*/=.,:;<>|!' ]+$")


def _bare_expression(text: str) -> str | None:
    """A reply that is nothing but one short expression (``\\frac{5}{6}``, ``3\\sqrt{2}``)
    is the answer as a whole; taking its last number would read ``\\frac{5}{6}`` as 6."""
    stripped = text.strip().strip("$").strip()
    if "\n" in stripped or len(stripped) > 120 or not stripped:
        return None
    if "\\" not in stripped and " " in stripped:
        return None  # plain prose: leave it to the number fallback
    return stripped if _LATEX_OR_MATH.match(stripped) else None


def strip_reasoning(text: str) -> str:
    # Drafts inside <think> must not count; only what follows the reasoning is the answer.
    lowered = text.lower()
    end = lowered.rfind("</think>")
    return text[end + len("</think>") :] if end >= 0 else text


def last_boxed(text: str) -> str | None:
    """Content of the last well-formed ``\\boxed{...}`` (or ``\\fbox``), braces balanced."""
    for match in reversed(list(re.finditer(r"\\(?:boxed|fbox)\b", text))):
        i = match.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j].strip()
            continue  # unbalanced (truncated output): try an earlier one
        token = re.match(r"[^\s$]+", text[i:])  # "\boxed 5"
        if token:
            return token.group(0)
    return None


_ANSWER_IS = re.compile(
    r"(?i)\banswer\s+(?:is|would\s+be|should\s+be|will\s+be)\b\s*[:：]?[ \t]*(.*)"
)
_ANSWER_COLON = re.compile(r"(?i)\banswer\**[ \t]*[:：][ \t]*(.*)")


def _marked_answer(text: str) -> str | None:
    """The text after the last "answer is" / "Answer:" marker (next line if it is empty)."""
    best: tuple[int, str] | None = None
    for pattern in (_ANSWER_IS, _ANSWER_COLON):
        for match in pattern.finditer(text):
            if best is None or match.start() >= best[0]:
                value = match.group(1).strip().strip("*").strip()
                if not value:  # "**Final answer:**\n\n42"
                    rest = text[match.end() :].strip().splitlines()
                    value = rest[0].strip() if rest else ""
                best = (match.start(), value)
    if best is None or not best[1]:
        return None
    return best[1]


def boxed_or_marked(text: str) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    marked = _marked_answer(text)
    if marked is not None:
        inner = last_boxed(marked)
        return inner if inner is not None else marked
    return None


def last_line(text: str) -> str | None:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


NUMBER = re.compile(
    r"(?:[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?"
    r"|[-+]?\.\d+)%?"
)


def _last_number(text: str) -> str | None:
    matches = NUMBER.findall(text)
    return matches[-1].replace(" ", "") if matches else None


def _last_inline_math(line: str) -> str | None:
    found = re.findall(r"\$([^$]+)\$|\\\((.+?)\\\)", line)
    if not found:
        return None
    dollar, paren = found[-1]
    return dollar or paren


def tidy(answer: str) -> str:
    """Strip markdown, math delimiters and sentence punctuation around an answer."""
    answer = answer.strip()
    for _ in range(3):
        before = answer
        answer = answer.strip().strip("*_`").strip()
        if answer.startswith("$") and answer.endswith("$") and len(answer) > 1:
            answer = answer.strip("$").strip()
        if answer.startswith("\\(") and answer.endswith("\\)"):
            answer = answer[2:-2].strip()
        if answer.startswith("\\[") and answer.endswith("\\]"):
            answer = answer[2:-2].strip()
        answer = re.sub(r"[.,;!]+$", "", answer).strip()
        if answer == before:
            break
    return answer


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(response: str) -> str:
    """The last fenced Python block (an unterminated final fence counts: truncated output),
    else the last unlabelled fence, else the whole response."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(response)]
    python = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    if python:
        return python[-1].rstrip() + "\n"
    plain = [body for lang, body in blocks if not lang]
    if plain:
        return plain[-1].rstrip() + "\n"
    return response.strip("\n") + "\n"


def extract_letter(response: str, letters: str = DEFAULT_LETTERS) -> str | None:
    """The chosen option letter, or None.

    Explicit forms win ("\\boxed{B}", "The answer is (B)", "Answer: B", "option C",
    "**B**"); only then the last line is read: a bare "B"/"(B)"/"B." line, a line starting
    "B)", or a standalone capital on it, skipping the article "A" and the pronoun "I"
    (as in "A car..." or "I think...").
    """
    text = strip_reasoning(response)
    valid = "".join(sorted(set(letters.upper())))
    if not valid or not text.strip():
        return None
    cls = f"[{re.escape(valid)}]"

    boxed = last_boxed(text)
    if boxed is not None:
        inner = re.sub(r"\\text(?:bf)?\{([^}]*)\}", r"\1", boxed).strip(" *()[]{}.")
        match = re.match(rf"({cls})(?![A-Za-z])", inner)
        if match:
            return match.group(1)

    explicit = re.compile(
        rf"(?i:\banswer|\boption|\bchoice)(?i:\s+is|\s+would\s+be|\s+should\s+be)?\s*[:：]?\s*"
        rf"(?i:option\s+|choice\s+)?[(\[*\s]*({cls})(?![A-Za-z0-9])"
    )
    found = explicit.findall(text)
    if found:
        return found[-1]

    bold = re.findall(rf"\*\*\s*\(?({cls})\)?[.:]?\s*\*\*", text)
    if bold:
        return bold[-1]

    last = last_line(text) or ""
    match = re.fullmatch(rf"[\W_]*({cls})[\W_]*", last)
    if match:
        return match.group(1)
    match = re.match(rf"\(?({cls})[).:]\s", last)
    if match:
        return match.group(1)
    standalone = []
    for m in re.finditer(rf"(?<![A-Za-z0-9'])({cls})(?![A-Za-z0-9'])", last):
        following = last[m.end() : m.end() + 3]
        if m.group(1) in "AI" and re.match(r"\s+[a-z]", following):
            continue  # the article "A ..." or the pronoun "I ..."
        standalone.append(m.group(1))
    return standalone[-1] if standalone else None
