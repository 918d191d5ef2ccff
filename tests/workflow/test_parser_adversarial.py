"""Hostile completions: the same results as before the parser was made linear, and checks
that overlapping scans share their work (counted, not timed: speed is `make bench
ARGS=parser`)."""

from __future__ import annotations

import hashlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conductor_pipeline.benchmarks.parsing import CASES, adversarial_texts, parse_outcome
from conductor_pipeline.workflow import WorkflowParseError, literal_scanner, parse_workflow, parser
from conductor_pipeline.workflow.literal_scanner import ListScanner

NO_WORKFLOW = (
    "WorkflowParseError: no workflow found: expected three labelled lists model_id, subtasks "
    "and access_list (e.g. 'model_id = [0]')"
)
NEVER_CLOSED_309 = (
    "WorkflowParseError: the model_id list opened at character 309 is never closed "
    "(unbalanced brackets, or the completion was cut off)"
)
# What the parser made of each 50,000-character case before the rewrite (quadratic then):
# the final outcome, and the number and digest of every labelled list it found on the way
# (kind, value, error), so that intermediate errors are pinned too.
EXPECTED = {
    "spaces_after_label": (NO_WORKFLOW, 0, "4f53cda18c2baa0c"),
    "whitespace_before_list": ("parsed 1 steps", 3, "5921c013cf00a9ce"),
    "bracket_nest": (
        "WorkflowParseError: the model_id list is nested more than 32 levels deep",
        1,
        "2d6c5d6cba07b584",
    ),
    "nested_labels": (NEVER_CLOSED_309, 31, "688c30d202893bff"),
    "nested_labels_comments": (NEVER_CLOSED_309, 31, "688c30d202893bff"),
    "quotes": (
        "WorkflowParseError: the model_id list opened at character 11 is never closed "
        "(unbalanced brackets, or the completion was cut off)",
        1,
        "88f1592f3b04a324",
    ),
    "escaped_quotes": (
        "WorkflowParseError: the model_id list has an unterminated string starting at "
        "character 2387",
        199,
        "849a199f038f9ba0",
    ),
    "repeated_labels": (
        "WorkflowParseError: more than 200 labelled lists; the completion looks degenerate",
        1,
        "96b0b84d612a6ac8",
    ),
    "random_bytes": (NO_WORKFLOW, 0, "4f53cda18c2baa0c"),
    "random_tokens": (
        "WorkflowParseError: the subtasks list has a mismatched ')' at character 49965",
        184,
        "4bca40a4ee2ba954",
    ),
    "largest_valid": ("parsed 5 steps", 3, "4a139ee4f98f53a4"),
}


def _records_digest(text: str) -> tuple[int, str]:
    try:
        records = parser._collect(parser._strip_think(text))
        rows = [
            (r.kind, repr(r.value), re.sub(r"0x[0-9a-f]+", "0x", r.error or "")) for r in records
        ]
    except WorkflowParseError as exc:
        rows = [("raised", str(exc))]
    return len(rows), hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def test_every_benchmark_case_is_pinned():
    assert set(EXPECTED) == set(CASES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hostile_inputs_keep_their_results(name):
    text = adversarial_texts(50_000)[name]
    assert len(text) <= 50_000
    outcome, count, digest = EXPECTED[name]
    assert parse_outcome(text) == outcome
    assert _records_digest(text) == (count, digest)


def test_the_reported_worst_case_and_long_whitespace_around_labels():
    # issue 15: 49,980 spaces after a label took 2.1 s
    with pytest.raises(WorkflowParseError, match="no workflow found"):
        parse_workflow("model_id:" + " " * 49_980 + "x", 3)
    spaces, lines = " \t" * 5_000, "\n" * 5_000
    text = (
        f"**model_id**{spaces}:{spaces}**{lines}[1]\n"
        f"subtasks = {lines}['a']\n"
        f'"access_list":{spaces}"[[]]'  # decoration after ':' then the list
    )
    wf = parse_workflow(text, 3)
    assert [s.worker for s in wf.steps] == [1] and wf.steps[0].subtask == "a"
    # a line break between ':' and the decoration is not a label (as before)
    with pytest.raises(WorkflowParseError, match="no workflow found"):
        parse_workflow("model_id:\n**[0]", 3)


# The label regex as it was written before (a leading look-behind and decoration), with the
# whitespace runs made possessive: the reference for what `_find_label` must find.
_REFERENCE_LABEL_RE = re.compile(
    r"(?<![\w])[*_`'\"]{0,3}(?P<label>model[ _-]?ids?|sub[ _-]?tasks?|access[ _-]?lists?|access)"
    r"(?![A-Za-z0-9])[*_`'\"]{0,3}[ \t]*+[:=][ \t]*+[*_`'\"]{0,3}\s*+\[",
    re.IGNORECASE,
)
_LABEL_PIECES = st.sampled_from(
    ["*", "_", "`", "'", '"', "a", "Z", "0", " ", "\t", "\n", ":", "=", "[", "é", "x_"]
    + ["model_id", "Model IDs", "subtasks", "sub-task", "access", "access_list", "ACCESS"]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_LABEL_PIECES, max_size=30).map("".join), st.integers(0, 10))
def test_label_search_matches_the_reference_regex(text, pos):
    pos = min(pos, len(text))
    got = parser._find_label(text, pos)
    want = _REFERENCE_LABEL_RE.search(text, pos)
    assert (got is None) == (want is None)
    if got is not None:
        assert (got.group("label"), got.end()) == (want.group("label"), want.end())


def _outcome(scanner: ListScanner, start: int, next_label: int) -> tuple[int, str] | str:
    try:
        return scanner.literal(start, "model_id", next_label)
    except WorkflowParseError as exc:
        return str(exc)


_SCAN_PIECES = st.sampled_from(
    list("[[[]]](){}'\"\\#\na,")
    + ["'''", '"""', "\\\\", "\\'", '\\"', "[" * 12, "]" * 12, "[" * 33]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_SCAN_PIECES, min_size=1, max_size=80).map(lambda parts: "[" + "".join(parts)))
def test_scans_that_share_memos_agree_with_fresh_scans(text):
    # Every '[' stands for a labelled list, scanned left to right as the parser does; the
    # shared scanner reuses what earlier scans memoised, a fresh one scans from scratch.
    opens = [i for i, c in enumerate(text) if c == "["]
    shared = ListScanner(text)
    for k, start in enumerate(opens):
        next_label = opens[k + 1] if k + 1 < len(opens) else len(text)
        assert _outcome(shared, start, next_label) == _outcome(ListScanner(text), start, len(text))


class _WriteOnce(dict):
    def __setitem__(self, key, value):
        assert key not in self, f"token {key} walked twice"
        super().__setitem__(key, value)


def test_overlapping_scans_walk_each_token_once(monkeypatch):
    # 31 unclosed lists inside each other: before, every one of them scanned to the end.
    # Now the first scan records the rest of each level, and the other 30 reuse it.
    scanners: list[ListScanner] = []

    class Recording(ListScanner):
        def __init__(self, text: str) -> None:
            super().__init__(text)
            self._levels = _WriteOnce()
            scanners.append(self)

    monkeypatch.setattr(parser, "ListScanner", Recording)
    for name in ("nested_labels", "nested_labels_comments", "random_tokens"):
        text = CASES[name](50_000)
        assert parse_outcome(text) == EXPECTED[name][0]  # a failed assertion would show here
        assert 0 < len(scanners[-1]._levels) <= len(text)


def test_each_quote_is_classified_once(monkeypatch):
    # 199 labels, each opening a string at a different escaped quote, all running to the
    # end: before, the string was matched again from every one of them.
    calls = []
    real = literal_scanner._is_escaped
    monkeypatch.setattr(
        literal_scanner, "_is_escaped", lambda text, q: calls.append(q) or real(text, q)
    )
    text = CASES["escaped_quotes"](50_000)
    assert parse_outcome(text) == EXPECTED["escaped_quotes"][0]
    assert len(calls) == len(set(calls)) <= text.count('"')
