"""Conductor, worker and recursion prompts."""

from __future__ import annotations

import re

import pytest

from conductor_pipeline.workflow import (
    DEFAULT_FEW_SHOT,
    FewShotExample,
    PriorStep,
    PromptConfig,
    Step,
    Workflow,
    conductor_messages,
    parse_workflow,
    recursion_messages,
    render_workflow,
    shown_worker_descriptions,
    worker_messages,
)

DESCRIPTIONS = ["fast generalist, cheap", "careful reasoner, pricey", "code specialist"]
QUESTION = "What is the sum of the first 10 odd numbers?"


def test_conductor_messages_structure_and_numbered_workers():
    msgs = conductor_messages(QUESTION, DESCRIPTIONS, PromptConfig(worker_info="description"))
    assert [m["role"] for m in msgs] == ["system", "user"]
    system, user = msgs[0]["content"], msgs[1]["content"]
    assert "never answer" in system
    for i, d in enumerate(DESCRIPTIONS):
        assert f"Worker {i}: {d}" in user
    assert "Worker 3" not in user
    # the question comes last, after the examples
    assert user.rstrip().endswith(f"Question: {QUESTION}")
    assert user.index("Example 1") < user.index("Example 2") < user.rindex("Question:")
    assert '"all"' in user and "[]" in user and "1 to 5 steps" in user
    assert "last step" in user
    # the default: workers do not see the question, the prompt says so
    assert "never see the question" in user


def test_workers_are_ordinals_by_default():
    """The paper's setting: the prompt numbers the workers and says nothing about them."""
    config = PromptConfig()
    user = conductor_messages(QUESTION, DESCRIPTIONS, config)[1]["content"]
    assert "Workers: 0, 1, 2" in user
    for d in DESCRIPTIONS:
        for word in d.replace(",", "").split():
            assert word not in user.split("Workers:")[1].split("\n")[0]
        assert d not in user
    assert shown_worker_descriptions(DESCRIPTIONS, config) == ["", "", ""]
    shown = shown_worker_descriptions(DESCRIPTIONS, PromptConfig(worker_info="description"))
    assert shown == DESCRIPTIONS
    with pytest.raises(ValueError, match="worker_info"):
        PromptConfig(worker_info="names")


def test_no_worker_names_are_added():
    names = ["gpt-4o", "qwen2.5-7b", "sim-math"]
    user = conductor_messages(QUESTION, DESCRIPTIONS)[1]["content"]
    for name in names:
        assert name not in user


def test_descriptions_default_from_config_and_empty_pool():
    cfg = PromptConfig(worker_descriptions=["only one"], worker_info="description")
    user = conductor_messages(QUESTION, None, cfg)[1]["content"]
    assert "Worker 0: only one" in user
    with pytest.raises(ValueError, match="worker pool is empty"):
        conductor_messages(QUESTION, [], PromptConfig())


def test_question_to_workers_switch_changes_rules():
    user = conductor_messages(QUESTION, DESCRIPTIONS, PromptConfig(question_to_workers=True))[1][
        "content"
    ]
    assert "Every worker also sees the question." in user


def test_step_cap_and_positional_switch():
    user = conductor_messages(
        QUESTION, DESCRIPTIONS, PromptConfig(max_steps=3, positional_access=False)
    )[1]["content"]
    assert "1 to 3 steps" in user
    assert "[0, 2] = only those earlier steps" not in user  # the rules offer no position list


def test_few_shot_examples_are_valid_renderings():
    user = conductor_messages(QUESTION, [""] * 7)[1]["content"]
    for ex in DEFAULT_FEW_SHOT:
        assert render_workflow(ex.workflow) in user
        assert parse_workflow(render_workflow(ex.workflow), 7) == ex.workflow


def test_few_shot_worker_ids_fit_small_pools():
    user = conductor_messages(QUESTION, ["solo worker"])[1]["content"]
    assert "model_id = [0, 0, 0, 0]" in user and "model_id = [0, 0]" in user
    assert re.findall(r"model_id = \[[0, ]+\]", user) == re.findall(r"model_id = \[.*\]", user)


def test_few_shot_from_dicts_and_text():
    cfg = PromptConfig(
        few_shot=[
            {
                "question": "Q1?",
                "workflow_text": "model_id = [0]\nsubtasks = ['do q1']\naccess_list = [[]]",
                "reasoning": "Easy.",
            },
            {"question": "Q2?", "workflow": Workflow([Step(0, "do q2")])},
        ]
    )
    assert all(isinstance(x, FewShotExample) for x in cfg.few_shot)
    user = conductor_messages(QUESTION, DESCRIPTIONS, cfg)[1]["content"]
    assert "Question: Q1?\nReply:\nEasy.\nmodel_id = [0]" in user
    assert "subtasks = ['do q2']" in user
    with pytest.raises(ValueError):
        PromptConfig(few_shot=[{"question": "bad", "workflow_text": "no lists here"}])
    assert (
        "Example"
        not in conductor_messages(QUESTION, DESCRIPTIONS, PromptConfig(few_shot=[]))[1]["content"]
    )


def test_default_prompt_is_compact():
    # character bounds keep it honest: the four worked examples (the GPU profile's prompt)
    # add about 2,800 characters; without them (the sandbox's) the prompt stays short
    msgs = conductor_messages(QUESTION, DESCRIPTIONS)
    assert sum(len(m["content"]) for m in msgs) < 4500
    bare = conductor_messages(QUESTION, DESCRIPTIONS, PromptConfig(few_shot=[]))
    assert sum(len(m["content"]) for m in bare) < 1500


TREE = Workflow(
    [
        Step(0, "Add 1+3+5+7+9."),
        Step(1, "Add 11+13+15+17+19."),
        Step(2, "Add the two partial sums.", (0,)),
    ]
)


def test_worker_message_shows_only_visible_steps_and_hides_question_by_default():
    msgs = worker_messages(QUESTION, TREE, 2, {0: "25", 1: "75"}, PromptConfig())
    assert len(msgs) == 1 and msgs[0]["role"] == "user"
    content = msgs[0]["content"]
    assert QUESTION not in content
    assert '<subtask step="0" worker="0">\nAdd 1+3+5+7+9.\n</subtask>' in content
    assert '<response step="0" worker="0">\n25\n</response>' in content
    assert "Add 11+13" not in content and "75" not in content
    assert content.endswith("Your subtask:\nAdd the two partial sums.")


def test_worker_message_question_switch():
    msgs = worker_messages(QUESTION, TREE, 0, {}, PromptConfig(question_to_workers=True))
    content = msgs[0]["content"]
    assert f"<question>\n{QUESTION}\n</question>" in content
    assert "<subtask step=" not in content
    assert content.endswith("Your subtask:\nAdd 1+3+5+7+9.")


def test_worker_message_missing_response():
    content = worker_messages(QUESTION, TREE, 2, {}, PromptConfig())[0]["content"]
    assert '<response step="0" worker="0">\n(no response)\n</response>' in content


def test_recursion_messages():
    previous = "Split it.\n" + render_workflow(TREE)
    msgs = recursion_messages(QUESTION, DESCRIPTIONS, previous, "100", PromptConfig())
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[:2] == conductor_messages(QUESTION, DESCRIPTIONS, PromptConfig())
    assert msgs[2]["content"] == previous
    follow = msgs[3]["content"]
    assert "<answer>\n100\n</answer>" in follow
    # the "keep it" instruction is itself a parseable empty workflow
    assert parse_workflow(follow, 3, allow_empty=True).is_empty


def test_recursion_answer_is_cropped():
    msgs = recursion_messages(
        QUESTION, DESCRIPTIONS, "x", "y" * 5000, PromptConfig(max_answer_chars=100)
    )
    assert "y" * 100 + " [...]" in msgs[3]["content"]
    assert "y" * 101 not in msgs[3]["content"]


def test_previous_round_is_shown_only_to_all_access_steps():
    wf = Workflow([Step(0, "start over"), Step(1, "improve on everything", (0,), all_access=True)])
    previous = [PriorStep(2, "first try", "41"), PriorStep(1, "check the try", None)]
    plain = worker_messages(QUESTION, wf, 0, {}, previous_round=previous)[0]["content"]
    assert "first try" not in plain and "41" not in plain
    seen = worker_messages(QUESTION, wf, 1, {0: "42"}, previous_round=previous)[0]["content"]
    assert seen.index("first try") < seen.index("41") < seen.index("start over")
    assert "check the try" in seen and "(no response)" in seen and "42" in seen
    # the recursion prompt tells the Conductor what "all" means there
    follow_up = recursion_messages(QUESTION, DESCRIPTIONS, "model_id = [0]", "41")[-1]["content"]
    assert '"all"' in follow_up


def test_binary_prompt_refuses_few_shot_examples_with_position_lists():
    partial = FewShotExample("q", Workflow([Step(0, "a"), Step(1, "b"), Step(1, "c", (1,))]))
    with pytest.raises(ValueError, match="few-shot example 1: step 2"):
        PromptConfig(few_shot=[partial], positional_access=False)
    PromptConfig(few_shot=[partial])  # fine where position lists are offered
    PromptConfig(positional_access=False)  # the default examples use "all" / [] only
