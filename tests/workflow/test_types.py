"""Workflow/Step records and the access-pattern classification."""

from __future__ import annotations

import pytest

from conductor_pipeline.workflow import Step, Workflow


def wf(*access):
    return Workflow([Step(0, f"s{i}", a) for i, a in enumerate(access)])


@pytest.mark.parametrize(
    ("workflow", "pattern"),
    [
        (Workflow([]), "empty"),
        (wf(()), "single"),
        (wf((), ()), "independent"),
        (wf((), (), ()), "independent"),
        (wf((), (0,)), "chain"),
        (wf((), (0,), (1,)), "chain"),
        (wf((), (0,), (0, 1)), "chain"),  # "all" everywhere is a chain
        (wf((), (), (0, 1)), "tree"),  # two attempts, then an aggregator
        (wf((), (0,), ()), "tree"),
        (wf((), (), (0,)), "tree"),
    ],
)
def test_access_pattern(workflow, pattern):
    assert workflow.access_pattern() == pattern


def test_helpers():
    w = Workflow((Step(2, " a "), Step(1, "b", [0, 0])))
    assert isinstance(w.steps, list)
    assert len(w) == 2 and not w.is_empty and Workflow([]).is_empty
    assert w.steps[0].subtask == "a"
    assert w.steps[1].access == (0,)
    assert w.workers == [2, 1]
    assert w.to_dict() == {"model_id": [2, 1], "subtasks": ["a", "b"], "access_list": [[], [0]]}
    assert wf((), (), (0, 1)).depth() == 2
    assert wf((), (0,), (1,)).depth() == 3
    assert Workflow([]).depth() == 0


def test_step_is_frozen_and_validated():
    s = Step(0, "x")
    with pytest.raises(AttributeError):
        s.worker = 1  # type: ignore[misc]
    with pytest.raises(ValueError):
        Step(True, "x")
    with pytest.raises(ValueError):
        Step(0, "   ")
    with pytest.raises(ValueError):
        Step(0, "x", (-1,))


def test_workflow_rejects_forward_access():
    with pytest.raises(ValueError, match="may only see earlier steps"):
        Workflow([Step(0, "a", (0,))])
    with pytest.raises(ValueError, match="may only see earlier steps"):
        Workflow([Step(0, "a"), Step(0, "b", (2,))])
