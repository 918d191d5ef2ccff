"""The training report's routing plot: per domain, who writes the answer over the steps,
and the workflow-shape shares, read from the per-step history as training logs it."""

from __future__ import annotations

import pandas as pd
import pytest

from conductor_pipeline.reporting import MissingInput
from conductor_pipeline.reporting import training as tr


def history() -> pd.DataFrame:
    """Three GRPO steps: maths at steps 1 and 3, logic at step 2 only; a recursion step 4."""
    return pd.DataFrame(
        {
            "step": [1.0, 2.0, 3.0, 4.0],
            "grpo/reward/mean": [0.1, 0.2, 0.3, None],
            "grpo/domain/math/worker/sim-sage": [0.5, None, 1.0, None],
            "grpo/domain/math/worker/sim-sprout": [0.5, None, 0.0, None],
            "grpo/domain/logic/worker/sim-sage": [None, 0.25, None, None],
            "grpo/domain/logic/worker/sim-sprout": [None, 0.75, None, None],
            "recursion/domain/math/worker/sim-sage": [None, None, None, 0.0],
            "recursion/domain/math/worker/sim-sprout": [None, None, None, 1.0],
            "grpo/shape/single": [1.0, 0.5, 0.25, None],
            "grpo/shape/solve_check": [0.0, 0.5, 0.75, None],
            "grpo/workflow/multi_step_share": [0.0, 0.5, 0.75, None],
        }
    )


def test_answer_workers_per_domain_keep_only_the_steps_the_domain_was_sampled():
    shares = tr.answer_workers_by_domain(history())
    assert list(shares) == ["logic", "math"]
    math_ = shares["math"].set_index("step")
    assert list(math_.index) == [1.0, 3.0, 4.0]  # the recursion stage continues the curve
    assert math_.loc[4.0, "sim-sprout"] == 1.0 and math_.loc[3.0, "sim-sage"] == 1.0
    assert list(shares["logic"]["step"]) == [2.0]


def test_shape_history_with_the_multi_step_share():
    shapes = tr.shape_history(history()).set_index("step")
    assert list(shapes.columns) == ["single", "solve_check", "multi-step"]
    assert shapes.loc[3.0, "solve_check"] == 0.75 and shapes.loc[2.0, "multi-step"] == 0.5


def test_routing_figure_has_one_panel_per_domain_and_one_for_shapes():
    figure = tr.routing_figure(history())
    titles = [ax.get_title() for ax in figure.axes]
    assert titles == [
        "logic: who writes the answer",
        "math: who writes the answer",
        "Workflow shapes (all domains)",
    ]


def test_an_older_history_without_routing_metrics_is_a_missing_input():
    older = history()[["step", "grpo/reward/mean"]]
    with pytest.raises(MissingInput, match="domain"):
        tr.routing_figure(older)
