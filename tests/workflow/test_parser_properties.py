"""Property tests: render/parse round trips, and garbage never escapes as anything but
WorkflowParseError."""

from __future__ import annotations

import dataclasses
import json
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conductor_pipeline.workflow import (
    Step,
    Workflow,
    WorkflowParseError,
    parse_workflow,
    render_workflow,
)

# Characters that stress the scanner and decoders: quotes, escapes, brackets, comment and
# label look-alikes, think tags, unicode, control characters and surrogates.
TRICKY = [
    "'",
    '"',
    "'''",
    '"""',
    "\\",
    "\\n",
    "\n",
    "\r",
    "\t",
    "[",
    "]",
    "{",
    "}",
    "(",
    ")",
    "#",
    ",",
    ":",
    "=",
    "model_id = [",
    "access_list: [[]]",
    "subtasks=",
    "<think>",
    "</think>",
    "```",
    "**",
    "é",
    "中文",
    "🎻",
    "\x00",
    "\ud800",
    "all",
    " ",
]
subtask_text = (
    st.lists(st.one_of(st.sampled_from(TRICKY), st.text(max_size=12)), min_size=1, max_size=12)
    .map("".join)
    .filter(lambda s: bool(s.strip()))
)


@st.composite
def workflows(draw):
    n_workers = draw(st.integers(1, 8))
    n_steps = draw(st.integers(1, 5))
    steps = []
    for i in range(n_steps):
        access = draw(st.sets(st.integers(0, i - 1), max_size=i)) if i else set()
        steps.append(Step(draw(st.integers(0, n_workers - 1)), draw(subtask_text), tuple(access)))
    return Workflow(steps), n_workers


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workflows())
def test_render_parse_round_trip(case):
    workflow, n_workers = case
    text = render_workflow(workflow)
    # a lone surrogate is not text: it comes back as U+FFFD (pairs as their character)
    expected = Workflow(
        [
            dataclasses.replace(
                s, subtask=s.subtask.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            )
            for s in workflow.steps
        ]
    )
    assert parse_workflow(text, n_workers) == expected
    # also with reasoning before it, inside a fence, after a think block, restated
    wrapped = f"<think>draft</think>Reasoning: split it up.\n```python\n{text}\n```\n"
    assert parse_workflow(wrapped, n_workers) == expected
    restated = render_workflow(Workflow([Step(0, "draft")])) + "\nFinal:\n" + text
    assert parse_workflow(restated, n_workers) == expected


@settings(max_examples=200, deadline=None)
@given(workflows())
def test_json_object_form_round_trip(case):
    workflow, n_workers = case
    try:
        text = json.dumps(workflow.to_dict(), ensure_ascii=False)
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates cannot be written as UTF-8 JSON text
        return
    if "<think>" in text.lower() or "</think>" in text.lower():
        return  # raw think tags in JSON are indistinguishable from reasoning blocks
    assert parse_workflow(text, n_workers) == workflow


# --------------------------------------------------------------------------- fuzzing

MUTATION_CHARS = list("[](){}'\"\\#,:=\n ax0123") + [
    "all",
    "<think>",
    "</think>",
    "```",
    "model_id=[",
]


def _bases(rng: random.Random) -> list[str]:
    bases = []
    for _ in range(40):
        n = rng.randint(1, 5)
        steps = []
        for i in range(n):
            access = tuple(sorted(rng.sample(range(i), rng.randint(0, i)))) if i else ()
            sub = "".join(
                rng.choice(["q", "'", '"', "[x]", "\\", "\n", "é", "#", " "])
                for _ in range(rng.randint(1, 15))
            )
            steps.append(Step(rng.randint(0, 3), sub if sub.strip() else "s", access))
        wf = Workflow(steps)
        text = render_workflow(wf)
        bases.append(text)
        bases.append("Reasoning.\n```json\n" + json.dumps(wf.to_dict()) + "\n```")
        bases.append("<think>plan</think>\n" + text.replace(" = ", ": "))
    return bases


def _mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        pos = rng.randrange(len(text) + 1)
        if op == 0 and text:  # delete a character
            text = text[: max(pos - 1, 0)] + text[pos:]
        elif op == 1:  # insert something nasty
            text = text[:pos] + rng.choice(MUTATION_CHARS) + text[pos:]
        elif op == 2:  # swap a bracket or quote for another
            idx = [i for i, c in enumerate(text) if c in "[](){}'\""]
            if idx:
                i = rng.choice(idx)
                text = text[:i] + rng.choice("[](){}'\"") + text[i + 1 :]
        elif op == 3:  # truncate
            text = text[:pos]
        elif op == 4:  # duplicate a slice
            j = rng.randrange(len(text) + 1)
            a, b = sorted((pos, j))
            text = text[:b] + text[a:b] + text[b:]
        else:  # replace a digit with something else
            idx = [i for i, c in enumerate(text) if c.isdigit()]
            if idx:
                i = rng.choice(idx)
                text = (
                    text[:i]
                    + rng.choice(["-1", "9", "True", "1.5", "'0'", "None", "[]"])
                    + text[i + 1 :]
                )
    return text


def _check_valid(wf: Workflow, n_workers: int) -> None:
    assert isinstance(wf, Workflow)
    assert len(wf) <= 5
    for i, s in enumerate(wf.steps):
        assert 0 <= s.worker < n_workers
        assert s.subtask.strip()
        assert all(0 <= j < i for j in s.access)


def _fuzz(n: int, seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    bases = _bases(rng)
    accepted = rejected = 0
    for k in range(n):
        if k % 10 == 9:  # some fully random texts too
            text = "".join(rng.choice(MUTATION_CHARS) for _ in range(rng.randint(0, 60)))
        else:
            text = _mutate(rng, rng.choice(bases))
        n_workers = rng.randint(1, 4)
        try:
            wf = parse_workflow(text, n_workers, allow_empty=k % 2 == 0)
        except WorkflowParseError:
            rejected += 1
            continue
        except BaseException as exc:  # pragma: no cover - that is the failure we look for
            raise AssertionError(f"{type(exc).__name__} escaped for input {text!r}") from exc
        _check_valid(wf, n_workers)
        accepted += 1
    return accepted, rejected


def test_fuzz_quick():
    accepted, rejected = _fuzz(5_000, seed=1)
    assert accepted > 0 and rejected > 0


def test_fuzz_100k_only_parse_errors_escape():
    # About 4 s here, so it runs by default (not marked slow).
    t0 = time.perf_counter()
    accepted, rejected = _fuzz(100_000, seed=20260)
    assert accepted + rejected == 100_000
    assert accepted > 1_000 and rejected > 1_000
    print(f"100k fuzz: {accepted} accepted, {rejected} rejected, {time.perf_counter() - t0:.1f}s")


@pytest.mark.parametrize(
    "text",
    [
        "model_id = " + "[" * 100_000,
        "model_id = [" + "(" * 40 + ")" * 40 + "]",
        "subtasks = ['" + "\\" * 1001,
        "model_id = [0]\nsubtasks = [" + "'a'," * 5000 + "]\naccess_list = [[]]",
        "model_id = [" + "1," * 20_000 + "]",
        "\x00" * 100 + "model_id=[\x00]",
        "model_id = [{}]\nsubtasks = [{'a': 1}]\naccess_list = [{1, 2}]",
        "model_id = [1e999]\nsubtasks = [b'x']\naccess_list = [[1j]]",
    ],
)
def test_pathological_inputs_raise_parse_error(text):
    with pytest.raises(WorkflowParseError):
        parse_workflow(text, 3)
