"""``make bench ARGS=parser``: parse time of hostile Conductor completions, up to the
parser's size limit (``ParseLimits.max_text_chars``, 50,000 characters).

Each case targets a way a parser can go super-linear: a regex that retries every split of
a long whitespace run, scans that start again from every label inside an unclosed list,
strings whose end is searched again from every quote. The parser is linear on all of them;
the figures show it per size (time per character should stay flat from 1k to 50k).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from conductor_pipeline.benchmarks import benchmark, timed

SIZES = (1_000, 16_000, 50_000)
TARGET_MS = 50.0


def _spaces_after_label(n: int) -> str:
    # the case reported in issue 15: 2.1 s at 50,000 characters before the fix
    return "model_id:" + " " * (n - 20) + "x"


def _whitespace_before_list(n: int) -> str:
    tail = "[0]\nsubtasks: ['a']\naccess_list: [[]]"
    run = n - len("model_id:") - len(tail)
    return "model_id:" + " \t" * (run // 4) + "\n" * (run - 2 * (run // 4)) + tail


def _bracket_nest(n: int) -> str:
    return "model_id = " + "[" * (n - 11)


def _nested_labels(n: int) -> str:
    # 31 lists that never close, each holding the next, then empty pairs to the end
    head = "model_id=[" * 31
    return head + "[]" * ((n - len(head)) // 2)


def _nested_labels_comments(n: int) -> str:
    head = "model_id=[" * 31
    return head + "#\n" * ((n - len(head)) // 2)


def _quotes(n: int) -> str:
    return "model_id = [" + '"' * (n - 12)


def _escaped_quotes(n: int) -> str:
    # each label opens a string at a different quote; all of them run to the end
    unit = 'model_id=[\\"'
    count = min(199, n // (2 * len(unit)))
    return unit * count + "a" * (n - count * len(unit))


def _repeated_labels(n: int) -> str:
    unit = "model_id: [0]\n"
    return (unit * (n // len(unit) + 1))[:n]


def _random_bytes(n: int) -> str:
    rng = random.Random(15)
    return bytes(rng.randrange(256) for _ in range(n)).decode("latin-1")


def _random_tokens(n: int) -> str:
    rng = random.Random(16)
    tokens = list("[](){}'\"\\#,:= \na0") + ['"""', "\\\\", "model_id=[", "subtasks: ["]
    weights = [1.0] * (len(tokens) - 2) + [0.05, 0.05]  # about 100 labels in 50,000 characters
    text = "".join(rng.choices(tokens, weights, k=n))
    return text[:n]


def _largest_valid(n: int) -> str:
    # the biggest answer the limits allow (5 steps of 4,000 characters), after reasoning
    repeats = max(1, min(124, (n - 200) // (5 * 32)))
    subtasks = [f"Step {i}: " + "check the arithmetic once more. " * repeats for i in range(5)]
    answer = (
        "\nmodel_id = [0, 1, 2, 0, 1]\nsubtasks = "
        + repr(subtasks)
        + '\naccess_list = [[], [0], "all", [2], "all"]'
    )
    reasoning = "Let me think about which worker is best suited. " * n
    return reasoning[: max(0, n - len(answer))] + answer


CASES: dict[str, Callable[[int], str]] = {
    "spaces_after_label": _spaces_after_label,
    "whitespace_before_list": _whitespace_before_list,
    "bracket_nest": _bracket_nest,
    "nested_labels": _nested_labels,
    "nested_labels_comments": _nested_labels_comments,
    "quotes": _quotes,
    "escaped_quotes": _escaped_quotes,
    "repeated_labels": _repeated_labels,
    "random_bytes": _random_bytes,
    "random_tokens": _random_tokens,
    "largest_valid": _largest_valid,
}


def adversarial_texts(n: int) -> dict[str, str]:
    """Every case at about ``n`` characters (at most ``n``; ``n`` of 1,000 or more)."""
    return {name: make(n) for name, make in CASES.items()}


def parse_outcome(text: str, n_workers: int = 3) -> str:
    """What the parser makes of ``text``: the number of steps, or the error message."""
    from conductor_pipeline.workflow import WorkflowParseError, parse_workflow

    try:
        return f"parsed {len(parse_workflow(text, n_workers))} steps"
    except WorkflowParseError as exc:
        return f"WorkflowParseError: {exc}"


def _cpu_seconds(fn: Callable[[], Any], repeat: int) -> list[float]:
    # CPU time of this process: a parse is single-threaded and CPU-bound, and on a shared
    # machine wall time mostly measures the neighbours
    out = []
    for _ in range(repeat):
        start = time.process_time()
        fn()
        out.append(time.process_time() - start)
    return sorted(out)


@benchmark("parser")
def parser_worst_case(sizes: tuple[int, ...] = SIZES, repeat: int = 7) -> dict[str, Any]:
    """Per case and size, the CPU time of one parse (median and best of ``repeat``), the
    wall-clock median, and microseconds per character (flat when the work is linear); then
    the worst case per size, and at the largest size against the target (50 ms)."""
    cases: dict[str, Any] = {}
    for name, make in CASES.items():
        row: dict[str, Any] = {}
        for n in sizes:
            text = make(n)
            cpu = _cpu_seconds(lambda text=text: parse_outcome(text), repeat)
            wall = sorted(timed(lambda text=text: parse_outcome(text), repeat))
            row[str(n)] = {
                "chars": len(text),
                "cpu_median_ms": cpu[len(cpu) // 2] * 1000,
                "cpu_min_ms": cpu[0] * 1000,
                "wall_median_ms": wall[len(wall) // 2] * 1000,
                "us_per_char": cpu[len(cpu) // 2] / len(text) * 1e6,
            }
        row["outcome"] = parse_outcome(make(sizes[-1]))[:100]
        cases[name] = row
    worst = {
        str(n): max(cases, key=lambda c, n=n: cases[c][str(n)]["cpu_median_ms"]) for n in sizes
    }
    largest = str(sizes[-1])
    worst_ms = cases[worst[largest]][largest]["cpu_median_ms"]
    return {
        "cases": cases,
        "worst_case_by_size": {
            n: {"case": c, "cpu_median_ms": cases[c][n]["cpu_median_ms"]} for n, c in worst.items()
        },
        "worst_case": worst[largest],
        "worst_cpu_median_ms": worst_ms,
        "target_ms": TARGET_MS,
        "meets_target": worst_ms < TARGET_MS,
    }
