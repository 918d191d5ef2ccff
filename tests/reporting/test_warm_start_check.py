"""The training report's warm start check (GRPO step 1's rollouts against their targets),
the multi-step figure (multi-step shares and the reward gap per step) and the parse-rate
figure's curriculum share, on histories with the metrics and on older ones without them."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from conductor_pipeline.reporting import MissingInput
from conductor_pipeline.reporting import training as tr


def history() -> pd.DataFrame:
    """Four GRPO steps with every metric; the reward gap only where a group held both kinds
    of attempt (steps 1 and 4); the SFT loss shares the step column, as from MLflow."""
    nan = float("nan")
    return pd.DataFrame(
        {
            "step": [1.0, 2.0, 3.0, 4.0, 5.0],
            "sft/loss": [2.0, 1.0, 0.5, 0.4, 0.3],
            "grpo/reward/mean": [0.4, 0.5, 0.6, 0.7, nan],
            "grpo/rollouts/parse_rate": [0.96, 0.97, 0.98, 0.99, nan],
            "grpo/rollouts/multi_step_attempt_share": [0.30, 0.25, 0.20, 0.40, nan],
            "grpo/rollouts/unequal_lists_rate": [0.02, 0.01, 0.0, 0.0, nan],
            "grpo/workflow/multi_step_share": [0.25, 0.2, 0.2, 0.35, nan],
            "grpo/reward/multi_minus_single": [-0.1, nan, nan, 0.2, nan],
        }
    )


def older_history() -> pd.DataFrame:
    """A run from before the attempt metrics: no attempt share, unequal lists or gap."""
    return history().drop(
        columns=[
            "grpo/rollouts/multi_step_attempt_share",
            "grpo/rollouts/unequal_lists_rate",
            "grpo/reward/multi_minus_single",
        ]
    )


def test_the_warm_start_check_reads_step_1_against_the_targets():
    check = tr.warm_start_check(history()).set_index("metric")
    assert check.loc["grpo/rollouts/parse_rate", "value"] == 0.96
    assert check["met"].to_dict() == {
        "grpo/rollouts/parse_rate": True,  # 96% >= 95%
        "grpo/rollouts/multi_step_attempt_share": False,  # 30% < 35%
        "grpo/rollouts/unequal_lists_rate": True,  # 2% <= 2%, at the limit
    }
    line, table = tr.warm_start_section(history())
    assert "2 of 3 targets met; not met: multi-step share of all attempts." in line
    assert list(table["met"]) == ["yes", "no", "yes"]
    assert list(table["step 1"]) == ["96.0%", "30.0%", "2.0%"]
    assert list(table["target"]) == ["≥ 95%", "≥ 35%", "≤ 2%"]


def test_every_target_met_and_none_met():
    good = history()
    good.loc[0, "grpo/rollouts/multi_step_attempt_share"] = 0.5
    line, _ = tr.warm_start_section(good)
    assert "3 of 3 targets met." in line and "not met" not in line
    bad = history()
    bad.loc[0, ["grpo/rollouts/parse_rate", "grpo/rollouts/unequal_lists_rate"]] = [0.5, 0.1]
    check = tr.warm_start_check(bad)
    assert list(check["met"]) == [False, False, False]


def test_an_older_history_says_what_it_did_not_log():
    check = tr.warm_start_check(older_history())
    assert list(check["met"]) == [True, None, None]
    assert math.isnan(check["value"].iloc[1]) and check["missing"].iloc[1] == tr.OLDER_RUN
    line, table = tr.warm_start_section(older_history())
    assert "1 of 1 targets met." in line
    assert (
        "Multi-step share of all attempts, unequal-length failures: not logged by this run" in line
    )
    assert list(table["met"])[1:] == ["not logged", "not logged"]
    assert list(table["step 1"])[1:] == ["—", "—"]


def test_a_history_without_grpo_step_1_is_a_missing_input():
    resumed = history()
    resumed.loc[0, [c for c in resumed.columns if c.startswith("grpo/")]] = float("nan")
    with pytest.raises(MissingInput, match="first logged grpo step is 2"):
        tr.warm_start_check(resumed)
    with pytest.raises(MissingInput, match="no 'grpo/"):
        tr.warm_start_check(history()[["step", "sft/loss"]])


def test_the_multi_step_figure_draws_both_panels_and_only_the_gaps_that_exist():
    figure = tr.multi_step_figure(history())
    share, gap = figure.axes
    assert share.get_title() == "Multi-step share per step"
    assert gap.get_title().startswith("Reward gap: multi-step minus single-step")
    labels = [line.get_label() for line in share.get_lines()]
    assert labels == ["all attempts, parsed or not (grpo)", "parsed workflows only (grpo)"]
    zero, points = gap.get_lines()
    assert list(zero.get_ydata()) == [0, 0]
    assert list(points.get_xdata()) == [1.0, 4.0] and list(points.get_ydata()) == [-0.1, 0.2]


def test_the_multi_step_figure_of_an_older_history_notes_what_is_missing():
    figure, note = tr.multi_step_figure(older_history())
    share, _ = figure.axes
    assert [line.get_label() for line in share.get_lines()] == ["parsed workflows only (grpo)"]
    assert "rollouts/multi_step_attempt_share" in note and "reward/multi_minus_single" in note
    assert "not logged by this run" in note
    with pytest.raises(MissingInput, match="not logged by this run"):
        tr.multi_step_figure(older_history().drop(columns=["grpo/workflow/multi_step_share"]))


def test_a_gap_logged_at_no_step_is_told_apart_from_an_older_run():
    never = history()
    never["grpo/reward/multi_minus_single"] = float("nan")
    _, note = tr.multi_step_figure(never)
    assert "no step did a group hold both single- and multi-step attempts" in note
    assert "not logged by this run" not in note


def test_the_parse_rate_figure_draws_the_curriculum_share_only_where_logged():
    drawn = history()
    drawn["grpo/rollouts/accuracy"] = [0.6, 0.7, 0.5, 0.8, float("nan")]
    drawn["grpo/curriculum/unsolved_share"] = [0.25, 0.25, 0.375, 0.5, float("nan")]
    (ax,) = tr.parse_rate_figure(drawn).axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    share = lines["curriculum: questions the reference worker got wrong (grpo)"]
    assert list(share.get_ydata()) == [0.25, 0.25, 0.375, 0.5]
    assert ax.get_title().endswith("with the curriculum's share")
    (plain,) = tr.parse_rate_figure(history()).axes
    assert [line.get_label() for line in plain.get_lines()] == ["parse rate (grpo)"]
    assert plain.get_title() == "Workflow parse rate and rollout accuracy"
