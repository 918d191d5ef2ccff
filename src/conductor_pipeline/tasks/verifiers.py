"""Check a free-text model response against a task's reference answer.

``verify(task, response)`` dispatches on ``task.verifier`` and always returns a
``Verdict``; a malformed or empty response is a wrong answer, never an exception (the RL
reward and the evaluation loop call this on whatever a model produced). Only a verifier
name we do not know raises, because that is a bug in the task data, not in the response.

The answer is read out of the response by :mod:`answer_extraction`, shared with the
simulated workers and evaluation.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from conductor_pipeline.hashing import content_hash
from conductor_pipeline.tasks import judge_pool
from conductor_pipeline.tasks.answer_extraction import (
    DEFAULT_LETTERS,
    MAX_ANSWER_CHARS,
    MAX_RESPONSE_CHARS,
    NUMBER,
    boxed_or_marked,
    extract_code,
    extract_final_answer,
    extract_letter,
    last_boxed,
    last_line,
    strip_reasoning,
    tidy,
)
from conductor_pipeline.tasks.code_sandbox import (
    SandboxLimits,
    run_call_tests,
    run_function_tests,
    run_stdio_tests,
)
from conductor_pipeline.tasks.types import VERIFIERS, Task

__all__ = ["Verdict", "judge_in_process", "load_parsers", "verify"]


@dataclass(frozen=True)
class Verdict:
    """Whether a response is right. ``score`` is in [0, 1] (partial credit for code tests
    and some reasoning-gym tasks); ``extracted`` is the answer we read from the response."""

    correct: bool
    score: float
    extracted: str | None
    reason: str


def verify(task: Task, response: str, *, time_limit_s: float | None = None) -> Verdict:
    """Judge ``response`` to ``task`` with the verifier the task names.

    The verifiers that hand the answer to an expression parser (``math``,
    ``reasoning_gym``) judge in a child process (:mod:`judge_pool`) and give up after
    ``time_limit_s`` (default ``CONDUCTOR_VERIFY_TIME_LIMIT_S`` or 10 s) with a wrong
    answer; code runs in its own sandbox with its own limits.
    """
    name = getattr(task, "verifier", None)
    if name not in _VERIFIER_FUNCTIONS:
        raise ValueError(f"unknown verifier {name!r}; expected one of {VERIFIERS}")
    if not isinstance(response, str):
        return Verdict(False, 0.0, None, f"response is not text ({type(response).__name__})")
    if not response.strip():
        return Verdict(False, 0.0, None, "empty response")
    text = response[-MAX_RESPONSE_CHARS:]
    if name in _PARSER_VERIFIERS:
        verdict = Verdict(*judge_pool.judge(task, text, time_limit_s))
    else:
        verdict = judge_in_process(task, text)
    score = min(1.0, max(0.0, float(verdict.score))) if math.isfinite(verdict.score) else 0.0
    return Verdict(verdict.correct, score, verdict.extracted, verdict.reason)


def judge_in_process(task: Task, response: str) -> Verdict:
    """The task's verifier, run here without a time limit (judge_pool's children call it)."""
    name = task.verifier
    try:
        return _VERIFIER_FUNCTIONS[name](task, response)
    except Exception as exc:  # a verifier bug or odd input must not crash a rollout
        return Verdict(False, 0.0, None, f"{name} verifier failed: {type(exc).__name__}: {exc}")


def load_parsers() -> None:
    """Import the expression parsers the child-process verifiers use."""
    import math_verify  # noqa: F401
    import reasoning_gym  # noqa: F401


# --------------------------------------------------------------------------------------
# Verifiers
# --------------------------------------------------------------------------------------


def _verify_math(task: Task, response: str) -> Verdict:
    extracted = extract_final_answer(response, "math")
    if extracted is None:
        return Verdict(False, 0.0, None, "no final answer found")
    if _math_equal(task.answer, extracted):
        return Verdict(True, 1.0, extracted, "matches the reference")
    return Verdict(
        False, 0.0, extracted, f"{extracted!r} does not match the reference {task.answer!r}"
    )


def _math_equal(gold: str, predicted: str) -> bool:
    # math-verify's own timeouts use SIGALRM, which only works in the main thread; in
    # worker threads we switch them off and rely on MAX_ANSWER_CHARS to bound the work.
    from math_verify import parse
    from math_verify import verify as mv_verify

    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold_parsed = _math_parse(parse, gold, timeout)
    pred_parsed = _math_parse(parse, predicted, timeout)
    if gold_parsed and pred_parsed:
        try:
            if mv_verify(gold_parsed, pred_parsed, timeout_seconds=timeout):
                return True
        except Exception:
            pass
    # Unparseable on either side: fall back to comparing the normalised strings.
    return _normalise_text(gold) == _normalise_text(predicted)


def _math_parse(parse: Callable[..., list[Any]], text: str, timeout: int | None) -> list[Any]:
    text = tidy(text)[:MAX_ANSWER_CHARS]
    text = re.sub(r"(?<!\\)%", r"\\%", text)  # a bare % would start a LaTeX comment
    if not text:
        return []
    # Wrapping in $...$ makes math-verify read LaTeX and plain expressions alike
    # ("x^2+1", "\sqrt{2}", "(1,2)" parse only this way).
    for candidate in (f"${text}$", text):
        try:
            parsed = parse(candidate, parsing_timeout=timeout)
        except Exception:
            parsed = []
        if parsed:
            return parsed
    return []


def _choices(task: Task) -> tuple[str, dict[str, str]]:
    """Valid letters and (when known) the option texts by letter."""
    raw = task.metadata.get("choices")
    if isinstance(raw, Mapping):
        texts = {str(k).strip().upper(): str(v) for k, v in raw.items()}
        return "".join(sorted(texts)), texts
    if isinstance(raw, (list, tuple)) and raw:
        letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[: len(raw)]
        return letters, {letters[i]: str(v) for i, v in enumerate(raw)}
    n = task.metadata.get("n_choices")
    if isinstance(n, int) and 0 < n <= 26:
        return "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:n], {}
    return DEFAULT_LETTERS, {}


def _verify_multiple_choice(task: Task, response: str) -> Verdict:
    letters, texts = _choices(task)
    gold = _gold_letter(task.answer, letters, texts)
    if gold is None:
        return Verdict(
            False,
            0.0,
            None,
            f"reference answer {task.answer!r} is not one of the options {letters}",
        )
    picked = extract_letter(response, letters)
    if picked is None and texts:
        # No letter, but the answer may quote an option's text ("The answer is Paris").
        stated = extract_final_answer(response, "text")
        matches = [
            k for k, v in texts.items() if stated and _normalise_text(v) == _normalise_text(stated)
        ]
        picked = matches[0] if len(matches) == 1 else None
    if picked is None:
        return Verdict(False, 0.0, None, "no option letter found")
    if picked == gold:
        return Verdict(True, 1.0, picked, "matches the reference")
    return Verdict(False, 0.0, picked, f"chose {picked}, the reference is {gold}")


def _gold_letter(answer: str, letters: str, texts: dict[str, str]) -> str | None:
    cleaned = answer.strip().strip("()[]*. ").upper()
    if len(cleaned) == 1 and cleaned in letters:
        return cleaned
    for letter, text in texts.items():
        if _normalise_text(text) == _normalise_text(answer):
            return letter
    return None


def _normalise_text(value: str) -> str:
    """Case-, space- and decoration-insensitive form used for exact-match comparison."""
    text = str(value)
    boxed = last_boxed(text)
    if boxed is not None:
        text = boxed
    text = re.sub(r"\\text(?:bf|rm)?\{([^}]*)\}", r"\1", text)
    text = re.sub(r"(?is)^\s*(?:the\s+)?(?:final\s+)?answer(?:\s+is|\s*[:：])\s*", "", text)
    text = tidy(text)
    quotes = "\"'`“”‘’«»"
    for _ in range(3):
        text = text.strip().strip(quotes).strip().strip("*_").strip()
        text = re.sub(r"^[.,;:!?]+|[.,;:!?]+$", "", text)
    return " ".join(text.lower().split())


def _verify_exact(task: Task, response: str) -> Verdict:
    extracted = extract_final_answer(response, "text")
    if extracted is None:
        return Verdict(False, 0.0, None, "no final answer found")
    accepted = [task.answer] + [str(a) for a in task.metadata.get("aliases", []) or []]
    got = _normalise_text(extracted)
    if got and any(got == _normalise_text(a) for a in accepted):
        return Verdict(True, 1.0, extracted, "matches the reference")
    return Verdict(
        False, 0.0, extracted, f"{extracted!r} does not match the reference {task.answer!r}"
    )


def parse_number(text: str) -> tuple[float, bool] | None:
    """A float from text like "$1,234.50", "75%", "-3/4", "\\frac{3}{4}", "1.5e-3",
    "2 \\times 10^{3}"; the flag says whether a percent sign was present."""
    s = str(text).strip()
    percent = "%" in s
    s = re.sub(r"\\text\{[^}]*\}", "", s)
    s = s.replace("\\%", "").replace("%", "").replace("\\$", "").replace("$", "")
    s = s.replace("\\!", "").replace("\\,", "").replace("−", "-").strip()
    s = re.sub(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}", r"(\1)/(\2)", s)
    s = re.sub(r"\s*(?:\\times|×|\*|x)\s*10\s*\^\s*\{?([-+]?\d+)\}?", r"e\1", s)
    s = s.replace(" ", "")
    if re.fullmatch(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "")
    frac = re.fullmatch(
        r"([-+]?)\(?([-+]?[\d.]+(?:e[-+]?\d+)?)\)?/\(?([-+]?[\d.]+(?:e[-+]?\d+)?)\)?", s, re.I
    )
    try:
        if frac:
            value = float(frac.group(2)) / float(frac.group(3))
            return (-value if frac.group(1) == "-" else value), percent
        return float(s), percent
    except (ValueError, ZeroDivisionError, OverflowError):
        pass
    # Not a bare number: fall back to the first number-like token ("42 apples").
    token = NUMBER.search(str(text))
    if token and token.group(0) != str(text).strip():
        inner = parse_number(token.group(0).replace(" ", ""))
        if inner is not None:
            return inner[0], percent
    return None


def _verify_numeric(task: Task, response: str) -> Verdict:
    gold = parse_number(task.answer)
    if gold is None:
        return Verdict(False, 0.0, None, f"reference answer {task.answer!r} is not a number")
    extracted = extract_final_answer(response, "number")
    if extracted is None:
        return Verdict(False, 0.0, None, "no number found")
    pred = parse_number(extracted)
    if pred is None:
        return Verdict(False, 0.0, extracted, f"{extracted!r} is not a number")
    rel_tol = float(task.metadata.get("rel_tol", 1e-6))
    abs_tol = float(task.metadata.get("abs_tol", 0.0))
    # "75%" may be meant as 75 or as 0.75: accept either reading against the reference.
    candidates = [pred[0]] + ([pred[0] / 100] if pred[1] else [])
    golds = [gold[0]] + ([gold[0] / 100] if gold[1] else [])
    if any(math.isclose(p, g, rel_tol=rel_tol, abs_tol=abs_tol) for p in candidates for g in golds):
        return Verdict(True, 1.0, extracted, "matches the reference within tolerance")
    return Verdict(False, 0.0, extracted, f"{pred[0]:g} differs from the reference {gold[0]:g}")


def _compiles(code: str) -> bool:
    try:
        compile(code, "<candidate>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


# Code verdicts kept per (task, its tests, the code a reply gives): running the tests takes a
# sandboxed subprocess (about 0.1 s), and evaluation's systems and training's rollouts hand
# in the same code again and again (294 distinct among the 810 code answers of a `make run`
# evaluation). A verdict a rerun might not repeat (a sandbox error, a test cut at
# its time limit on a busy machine) is not kept.
_CODE_VERDICTS: dict[tuple[str, str, str], Verdict] = {}
_CODE_VERDICTS_KEPT = 20_000  # then the memo starts again: a long run's programs fill memory


def _verify_code(task: Task, response: str) -> Verdict:
    code = extract_code(strip_reasoning(response))
    key = (task.id, content_hash(task.metadata), code)
    kept = _CODE_VERDICTS.get(key)
    if kept is not None:
        return kept
    verdict, repeatable = _run_code_tests(task, _program(task, code))
    if repeatable:
        if len(_CODE_VERDICTS) >= _CODE_VERDICTS_KEPT:
            _CODE_VERDICTS.clear()
        _CODE_VERDICTS[key] = verdict
    return verdict


def _program(task: Task, code: str) -> str:
    """The candidate's code as it runs: with the prompt's imports and helpers."""
    meta = task.metadata
    entry_point = meta.get("entry_point") or None
    prompt = str(meta.get("prompt", "") or "")
    if entry_point and prompt:
        definition = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.M)
        if definition.search(code):
            # A full definition: keep the prompt's imports and helpers; its docstring-only
            # stub is harmless and is redefined by the candidate. A stub with no body at all
            # (a bare signature) would not compile, so then keep only what precedes it.
            combined = prompt.rstrip("\n") + "\n\n" + code
            stub = definition.search(prompt)
            if stub is not None and not _compiles(combined):
                combined = prompt[: stub.start()] + code
            code = combined
        else:
            code = prompt + code  # a completion of the prompt's function body
    return code


def _run_code_tests(task: Task, code: str) -> tuple[Verdict, bool]:
    """The verdict of ``task``'s tests on ``code``, and whether a rerun would repeat it."""
    meta = task.metadata
    entry_point = meta.get("entry_point") or None
    prompt = str(meta.get("prompt", "") or "")
    limits = SandboxLimits(
        wall_timeout_s=float(meta.get("timeout_s", 10)),
        cpu_time_s=int(meta.get("cpu_time_s", meta.get("timeout_s", 10))),
        memory_mb=int(meta.get("memory_mb", 512)),
        site_packages=bool(meta.get("site_packages", False)),
    )
    if meta.get("test"):
        # The prompt is trusted: the tests use its helpers, not the candidate's versions.
        report = run_function_tests(
            code, str(meta["test"]), entry_point, limits=limits, context=prompt or None
        )
    elif meta.get("tests") and meta.get("test_style") == "functional":
        # LeetCode-style: call Solution().<func_name> with each case's JSON arguments.
        func_name = str(meta.get("func_name") or "")
        report = run_call_tests(code, list(meta["tests"]), func_name, limits=limits)
    elif meta.get("tests"):
        report = run_stdio_tests(code, list(meta["tests"]), limits=limits)
    else:
        return Verdict(False, 0.0, code, "the task has no tests (metadata 'test' or 'tests')"), True
    repeatable = not report.sandbox_error and not any(r.timed_out for r in report.runs)
    if report.all_passed:
        return Verdict(True, 1.0, code, f"all {report.total} tests passed"), repeatable
    prefix = "sandbox error: " if report.sandbox_error else ""
    reason = f"{prefix}{report.passed}/{report.total} tests passed; first failure: {report.first_failure}"
    return Verdict(False, report.fraction, code, reason), repeatable


@functools.cache
def _reasoning_gym_dataset(name: str) -> Any:
    # Building a dataset can be slow; the scorer only needs one instance per name.
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=1, seed=0)


def extract_reasoning_gym_answer(response: str) -> str | None:
    """reasoning-gym scores the bare answer: <answer> tags, boxed, markers, last line."""
    text = strip_reasoning(response)
    tagged = re.findall(r"(?is)<answer>(.*?)(?:</answer>|\Z)", text)
    if tagged and tagged[-1].strip():
        return tagged[-1].strip()
    answer = boxed_or_marked(text)
    if answer is None:
        answer = last_line(text)
    return tidy(answer) if answer else None


def _verify_reasoning_gym(task: Task, response: str) -> Verdict:
    name = task.metadata.get("dataset")
    entry = task.metadata.get("entry")
    if not name or not isinstance(entry, Mapping):
        return Verdict(
            False, 0.0, None, "task metadata lacks the reasoning-gym 'dataset' and 'entry'"
        )
    extracted = extract_reasoning_gym_answer(response)
    if extracted is None:
        return Verdict(False, 0.0, None, "no final answer found")
    entry = dict(entry)
    entry.setdefault("answer", task.answer)
    entry.setdefault("question", task.question)
    entry.setdefault("metadata", {})
    score = float(
        _reasoning_gym_dataset(str(name)).score_answer(answer=extracted, entry=entry) or 0.0
    )
    if score >= 1.0:
        return Verdict(True, 1.0, extracted, f"{name} scorer accepts the answer")
    return Verdict(False, score, extracted, f"{name} scorer gives {score:g}")


_VERIFIER_FUNCTIONS: dict[str, Callable[[Task, str], Verdict]] = {
    "math": _verify_math,
    "multiple_choice": _verify_multiple_choice,
    "exact": _verify_exact,
    "numeric": _verify_numeric,
    "code": _verify_code,
    "reasoning_gym": _verify_reasoning_gym,
}
# judged in a child process under a time limit: their parsers can run for hours on a short
# answer while holding the GIL
_PARSER_VERIFIERS = frozenset({"math", "reasoning_gym"})
