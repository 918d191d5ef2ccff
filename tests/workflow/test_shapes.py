"""workflow_shape names the plan a workflow follows, from its access lists alone."""

from __future__ import annotations

import pytest

from conductor_pipeline.workflow import SHAPES, Step, Workflow, workflow_shape


def flow(*access: tuple[int, ...]) -> Workflow:
    """A workflow with one step per access list (workers and subtasks do not matter)."""
    return Workflow([Step(i % 3, f"subtask {i}", a) for i, a in enumerate(access)])


@pytest.mark.parametrize(
    ("workflow", "shape"),
    [
        (flow(()), "single"),
        (flow((), (0,)), "solve_check"),
        (flow((), ()), "independent"),
        (flow((), (), (0, 1)), "parallel_aggregate"),
        (flow((), (), (), (0, 1, 2)), "parallel_aggregate"),
        (flow((), (0,), (1,)), "chain"),
        (flow((), (0,), (0, 1)), "chain"),  # "all" everywhere is a chain
        (flow((), (0,), (1,), (2,)), "chain"),
        (flow((), (), ()), "independent"),
        (flow((), (0,), ()), "independent"),  # the answer step ignores the others
        (flow((), (), (0,)), "other"),  # an aggregator that misses an attempt
        (flow((), (0,), (0,)), "other"),  # two steps see the first, the last not the second
        (flow((), (), (0, 1), (0,)), "other"),
        (Workflow([]), "other"),  # the recursion round's "keep the answer"
    ],
)
def test_shapes(workflow, shape):
    assert workflow_shape(workflow) == shape
    assert shape in SHAPES


def test_workers_and_subtasks_do_not_change_the_shape():
    a = Workflow([Step(0, "solve it"), Step(0, "check it", (0,))])
    b = Workflow([Step(4, "something else"), Step(2, "and more", (0,))])
    assert workflow_shape(a) == workflow_shape(b) == "solve_check"


def test_parsed_paper_format():
    from conductor_pipeline.workflow import parse_workflow

    text = 'model_id = [0, 1, 2]\nsubtasks = ["a", "b", "combine"]\naccess_list = [[], [], "all"]'
    assert workflow_shape(parse_workflow(text, 3)) == "parallel_aggregate"
