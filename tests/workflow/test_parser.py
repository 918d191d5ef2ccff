"""Unit tests for parse_workflow / render_workflow: accepted variants and error messages."""

from __future__ import annotations

import json

import pytest

from conductor_pipeline.workflow import (
    ParseLimits,
    Step,
    UnequalListsError,
    Workflow,
    WorkflowParseError,
    attempted_steps,
    parse_workflow,
    render_workflow,
    workflow_from_lists,
)

TREE = Workflow([Step(0, "solve A"), Step(1, "solve B"), Step(2, "combine", (0, 1))])


def lists(
    mid: str, sub: str, acc: str, sep: str = " = ", labels=("model_id", "subtasks", "access_list")
) -> str:
    return f"{labels[0]}{sep}{mid}\n{labels[1]}{sep}{sub}\n{labels[2]}{sep}{acc}"


PY = lists("[0, 1, 2]", "['solve A', 'solve B', 'combine']", "[[], [], 'all']")


# --------------------------------------------------------------------------- accepted


@pytest.mark.parametrize(
    "text",
    [
        PY,
        "Let me think about this.\nTwo attempts, then a check.\n\n" + PY,
        lists("[0, 1, 2]", '["solve A", "solve B", "combine"]', '[[], [], ["all"]]', sep=": "),
        lists("[0,1,2]", '["solve A","solve B","combine"]', "[[],[],[0,1]]", sep="="),
        "```python\n" + PY + "\n```",
        "Reasoning first.\n```\n" + PY + "\n```\nDone.",
        lists(
            "[0, 1, 2]",
            "['solve A', 'solve B', 'combine']",
            "[[], [], 'all']",
            sep=": ",
            labels=("**model_id**", "**subtasks**", "**access_list**"),
        ),
        "**model_id:** [0, 1, 2]\n**subtasks:** ['solve A', 'solve B', 'combine']\n**access_list:** [[], [], 'all']",
        lists(
            "[0, 1, 2]",
            "['solve A', 'solve B', 'combine']",
            "[[], [], 'all']",
            sep=": ",
            labels=("`model_id`", "`subtasks`", "`access_list`"),
        ),
        lists(
            "[0, 1, 2]",
            "['solve A', 'solve B', 'combine']",
            "[[], [], 'all']",
            sep=": ",
            labels=("model id", "subtask", "access list"),
        ),
        lists(
            "[0, 1, 2]",
            "['solve A', 'solve B', 'combine']",
            "[[], [], 'all']",
            sep=": ",
            labels=("Model IDs", "Subtasks", "Access"),
        ),
        lists(
            "[0, 1, 2]",
            "['solve A', 'solve B', 'combine']",
            "[[], [], 'all']",
            labels=("model_ids", "subtasks", "access"),
        ),
        '{"model_id": [0, 1, 2], "subtasks": ["solve A", "solve B", "combine"], "access_list": [[], [], "all"]}',
        '```json\n{\n  "model_id": [0, 1, 2],\n  "subtasks": ["solve A", "solve B", "combine"],\n'
        '  "access_list": [[], [], [0, 1]]\n}\n```',
        # reordered keys in a JSON object
        '{"subtasks": ["solve A", "solve B", "combine"], "access_list": [[], [], "all"], "model_id": [0, 1, 2]}',
        "<think>maybe model_id = [2, 2, 2]?</think>\n" + PY,
        "<THINK>\nhmm\n</THINK>" + PY,
        # the chat template opened the think block, the model only closes it
        "reasoning about model_id = [1]\n</think>\n" + PY,
        # restated: the last complete set wins
        lists("[2, 2]", "['x', 'y']", "[[], []]") + "\nOn reflection:\n" + PY,
        # a stray earlier mention of one label does not get mixed in
        "I will use access_list = [[], [0]] maybe.\n" + PY,
        # comments and trailing commas inside the lists
        "model_id = [0, 1, 2,]  # workers\nsubtasks = [\n  'solve A',  # first ']'\n  'solve B',\n  'combine',\n]\naccess_list = [[], [], 'all']",
    ],
)
def test_accepted_variants(text):
    assert parse_workflow(text, 3) == TREE


def test_last_complete_set_wins_over_cut_off_restatement():
    text = PY + "\nLet me restate:\nmodel_id = [1]\nsubtasks = ['only one"
    assert parse_workflow(text, 3) == TREE


def test_labels_inside_subtasks_are_not_labels():
    text = lists("[0, 1]", "['print model_id = [5] and access: [9]', 'x']", "[[], 'all']")
    wf = parse_workflow(text, 2)
    assert wf.steps[0].subtask == "print model_id = [5] and access: [9]"
    assert wf.steps[1].access == (0,)


def test_access_resolution():
    text = lists(
        "[0, 0, 0, 0, 0]", "['a', 'b', 'c', 'd', 'e']", "['all', ['all'], [], [2, 0, 2], 'ALL']"
    )
    wf = parse_workflow(text, 1)
    assert [s.access for s in wf.steps] == [(), (0,), (), (0, 2), (0, 1, 2, 3)]


def test_strings_with_quotes_newlines_and_brackets():
    text = lists("[0]", '["He said \\"hi\\" [x] {y} (z) # not a comment\\n\'ok\'"]', "[[]]")
    assert (
        parse_workflow(text, 1).steps[0].subtask
        == "He said \"hi\" [x] {y} (z) # not a comment\n'ok'"
    )


def test_triple_quoted_string_and_raw_newline_tolerated():
    wf = parse_workflow(lists("[0]", "['''line 1\nline 2''']", "[[]]"), 1)
    assert wf.steps[0].subtask == "line 1\nline 2"
    # a raw line break inside a plain string (invalid Python and JSON) is repaired
    wf = parse_workflow(lists("[0]", '["line 1\nline 2"]', "[[]]"), 1)
    assert wf.steps[0].subtask == "line 1\nline 2"


def test_subtasks_are_stripped():
    wf = parse_workflow(lists("[0]", "['  padded \\n']", "[[]]"), 1)
    assert wf.steps[0].subtask == "padded"


def test_empty_workflow_only_when_allowed():
    text = "Keep it.\nmodel_id = []\nsubtasks = []\naccess_list = []"
    assert parse_workflow(text, 3, allow_empty=True).is_empty
    with pytest.raises(WorkflowParseError, match="only allowed in a recursion round"):
        parse_workflow(text, 3)


def test_custom_limits():
    text = lists("[0, 0]", "['a', 'b']", "[[], []]")
    with pytest.raises(WorkflowParseError, match="2 steps; at most 1"):
        parse_workflow(text, 1, limits=ParseLimits(max_steps=1))


# --------------------------------------------------------------------------- rejected

BAD = [
    ("I would ask worker 1.", "no workflow found"),
    ("", "no workflow found"),
    ("model_id = [0]\nsubtasks = ['a']", "found model_id and subtasks but no access_list"),
    ("access_list = [[]]", "found access_list but no model_id or subtasks"),
    (
        lists("[0, 1]", "['a']", "[[], []]"),
        "equal length.*model_id has 2 entries, subtasks 1 and access_list 2",
    ),
    (
        lists("[0, 3]", "['a', 'b']", "[[], []]"),
        r"model_id\[1\] is 3, but the pool has 3 workers \(ids 0 to 2\)",
    ),
    (lists("[0, -1]", "['a', 'b']", "[[], []]"), r"model_id\[1\] is -1"),
    (
        lists("[0, 'x']", "['a', 'b']", "[[], []]"),
        r"model_id\[1\] is 'x'; worker ids must be integers",
    ),
    (
        lists("[0, 1.0]", "['a', 'b']", "[[], []]"),
        r"model_id\[1\] is 1.0; worker ids must be integers",
    ),
    (lists("[True]", "['a']", "[[]]"), r"model_id\[0\] is True; worker ids must be integers"),
    (lists("[true]", '["a"]', "[[]]"), r"model_id\[0\] is True; worker ids must be integers"),
    (lists("[0, 0, 0, 0, 0, 0]", str(["a"] * 6), str([[]] * 6)), "6 steps; at most 5"),
    (lists("[0, 0]", "['a', '   ']", "[[], []]"), r"subtasks\[1\] is empty"),
    (lists("[0, 0]", "['a', 7]", "[[], []]"), r"subtasks\[1\] is 7; subtasks must be strings"),
    (lists("[0]", repr(["x" * 4001]), "[[]]"), r"subtasks\[0\] has 4001 characters; at most 4000"),
    (
        lists("[0, 0, 0]", "['a', 'b', 'c']", "[[], [], [3]]"),
        r"access_list\[2\] refers to step 3, which is not earlier than step 2",
    ),
    (
        lists("[0, 0]", "['a', 'b']", "[[], [1]]"),
        r"access_list\[1\] refers to step 1, which is not earlier than step 1",
    ),
    (
        lists("[0, 0]", "['a', 'b']", "[[], [-1]]"),
        r"access_list\[1\] refers to step -1; step positions must be non-negative",
    ),
    (
        lists("[0, 0]", "['a', 'b']", "[[], ['0']]"),
        r"access_list\[1\] contains '0'; step positions must be integers",
    ),
    (
        lists("[0, 0]", "['a', 'b']", "[[], [True]]"),
        r"access_list\[1\] contains True; step positions must be integers",
    ),
    (
        lists("[0, 0]", "['a', 'b']", "[[], 'some']"),
        r"access_list\[1\] is 'some'; expected 'all', \[\] or a list",
    ),
    (lists("[0, 0]", "['a', 'b']", "[[], 0]"), r"access_list\[1\] is 0; expected 'all'"),
    (lists("[0, 0]", "['a', 'b']", "[[], None]"), r"access_list\[1\] is None"),
    (
        lists("[0, 0]", "['a', 'b']", "[[], ['all', 0]]"),
        r"access_list\[1\] mixes 'all' with step positions",
    ),
    (
        "model_id = [0, 1\nsubtasks = ['a', 'b']\naccess_list = [[], []]",
        "mismatched|never closed|not a valid",
    ),
    ("model_id = [0]\nsubtasks = ['a]\naccess_list = [[]]", "unterminated string|never closed"),
    ("model_id = [0]\nsubtasks = ['a')\naccess_list = [[]]", "mismatched"),
    (
        "model_id = [0]\nsubtasks = [foo('a')]\naccess_list = [[]]",
        "the subtasks list is not a valid Python or JSON literal",
    ),
    (
        "model_id = [0]\nsubtasks = [f'a']\naccess_list = [[]]",
        "the subtasks list is not a valid Python or JSON literal",
    ),
    ("model_id = " + "[" * 5000 + "]" * 5000, "nested more than 32 levels"),
    ("<think>model_id = [0]\nsubtasks = ['a']\naccess_list = [[]]", "unclosed <think> block"),
    (PY + "\n<think>second thoughts", "unclosed <think> block"),
    ("<think>" + PY + "</think>", "no workflow found"),
    ("x" * 50_001, "50001 characters; at most 50000"),
    ("model_id = [0]\n" * 300, "more than 200 labelled lists"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_rejected_with_message(text, message):
    with pytest.raises(WorkflowParseError, match=message):
        parse_workflow(text, 3)


def test_error_is_value_error_and_bad_arguments():
    assert issubclass(WorkflowParseError, ValueError)
    with pytest.raises(WorkflowParseError, match="expected the completion as a str"):
        parse_workflow(None, 3)  # type: ignore[arg-type]
    with pytest.raises(WorkflowParseError, match="n_workers must be a positive integer"):
        parse_workflow(PY, 0)


def test_unexpected_exceptions_are_wrapped(monkeypatch):
    import conductor_pipeline.workflow.parser as parser

    def boom(text):
        raise KeyError("surprise")

    monkeypatch.setattr(parser, "_strip_think", boom)
    with pytest.raises(WorkflowParseError, match="KeyError"):
        parse_workflow(PY, 3)


def test_huge_integer_and_null_bytes_are_parse_errors():
    with pytest.raises(WorkflowParseError):
        parse_workflow(lists("[" + "9" * 5000 + "]", "['a']", "[[]]"), 3)
    with pytest.raises(WorkflowParseError):
        parse_workflow(lists("[0]", "['a\x00']", "[[]]"), 3)


# --------------------------------------------------------------------------- render


def test_render_is_canonical_and_round_trips():
    text = render_workflow(TREE)
    assert text == (
        "model_id = [0, 1, 2]\n"
        "subtasks = ['solve A', 'solve B', 'combine']\n"
        'access_list = [[], [], "all"]'
    )
    assert parse_workflow(text, 3) == TREE
    partial = Workflow([Step(0, "a"), Step(0, "b"), Step(0, "c", (1,))])
    assert "access_list = [[], [], [1]]" in render_workflow(partial)
    assert parse_workflow(render_workflow(partial), 1) == partial


def test_render_escapes_think_tags_in_subtasks():
    wf = Workflow([Step(0, "explain what <think> and </THINK> do")])
    text = render_workflow(wf)
    assert "<think>" not in text.lower()
    assert parse_workflow(text, 1) == wf


def test_render_empty_workflow():
    text = render_workflow(Workflow([]))
    assert text == "model_id = []\nsubtasks = []\naccess_list = []"
    assert parse_workflow(text, 1, allow_empty=True) == Workflow([])


def test_workflow_from_lists_matches_json_dict():
    wf = workflow_from_lists(*TREE.to_dict().values(), 3)
    assert wf == TREE
    assert json.loads(json.dumps(TREE.to_dict())) == TREE.to_dict()


def test_binary_access_refuses_position_lists_with_a_clear_message():
    binary = lists("[0, 1, 1]", "['a', 'b', 'c']", "['all', [], ['all']]")
    wf = parse_workflow(binary, 2, positional_access=False)
    assert [s.access for s in wf.steps] == [(), (), (0, 1)]
    for access, entry in (
        ("[[], [], [0]]", "access_list[2]"),
        ("[[], [0], 'all']", "access_list[1]"),
    ):
        with pytest.raises(WorkflowParseError) as err:
            parse_workflow(
                lists("[0, 1, 1]", "['a', 'b', 'c']", access), 2, positional_access=False
            )
        message = str(err.value)
        assert (
            entry in message and "positional_access: false" in message and "'all' or []" in message
        )
    with pytest.raises(WorkflowParseError, match="positional_access"):
        workflow_from_lists([0, 1], ["a", "b"], [[], [0]], 2, positional_access=False)
    # position lists stay valid where they are switched on (the default)
    assert parse_workflow(lists("[0, 1]", "['a', 'b']", "[[], [0]]"), 2).steps[1].access == (0,)


def test_all_access_is_remembered_even_on_the_first_step():
    """'all' on step 0 sees nothing in its own round but everything of the previous round in
    a recursion round, so the parser keeps that it was written and render writes it back."""
    wf = parse_workflow(lists("[0, 1, 1]", "['a', 'b', 'c']", "['all', [], [0, 1]]"), 2)
    assert [s.all_access for s in wf.steps] == [True, False, False]
    assert wf.steps[0].access == ()
    text = render_workflow(wf)
    assert 'access_list = ["all", [], "all"]' in text
    assert parse_workflow(text, 2).steps[0].all_access
    assert wf == Workflow([Step(0, "a"), Step(1, "b"), Step(1, "c", (0, 1))])
    with pytest.raises(ValueError, match="all_access"):
        Workflow([Step(0, "a"), Step(1, "b"), Step(1, "c", (1,), all_access=True)])


@pytest.mark.parametrize("quote", ["'", '"'])
def test_escaped_surrogate_pairs_become_their_character(quote):
    # a model writing JSON escapes writes U+1F600 as a surrogate pair; Python's literals
    # would keep two lone surrogates, which no UTF-8 request or response can carry
    text = (
        f"model_id = [0, 1]\nsubtasks = [{quote}a\\ud83d\\ude00b{quote}, "
        f"{quote}lone \\ud800 here{quote}]\naccess_list = [[], []]"
    )
    wf = parse_workflow(text, 2)
    assert [s.subtask for s in wf.steps] == ["a\U0001f600b", "lone \ufffd here"]
    for step in wf.steps:
        step.subtask.encode("utf-8")  # valid text


# --------------------------------------------------------------------------- attempts


def test_unequal_lists_have_their_own_error():
    with pytest.raises(UnequalListsError, match="equal length"):
        parse_workflow(lists("[0, 1]", "['a']", "[[], []]"), 3)
    with pytest.raises(WorkflowParseError) as caught:
        parse_workflow(lists("[0, 7]", "['a', 'b']", "[[], []]"), 3)
    assert not isinstance(caught.value, UnequalListsError)


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        (PY, 3),
        (lists("[0, 1]", "['a']", "[[], []]"), 2),  # unequal: still two steps attempted
        ("model_id = [0, 1, 2, 3]\nsubtasks = ['a'", 4),  # cut off after the ids
        ("Plan: model_id = [0]\n" + lists("[1, 2]", "['a', 'b']", "[[], 'all']"), 2),  # the last
        ("model_id = [0, 1", 0),  # no list could be read
        ("I would ask worker 1.", 0),
        (None, 0),
    ],
)
def test_attempted_steps_counts_the_last_readable_model_id_list(text, steps):
    assert attempted_steps(text) == steps
