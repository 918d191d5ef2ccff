"""Does the warm start write multi-step workflows, and does trying pay? The warm start check
at GRPO step 1 against its targets, and the multi-step shares and reward gap over training."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from conductor_pipeline.reporting.display import MissingInput, new_figure
from conductor_pipeline.reporting.training_curves import _line_plot, _step_axis
from conductor_pipeline.reporting.training_history import STAGES, stage_series, stage_steps

# GRPO step 1's rollouts are sampled from the SFT warm start, before any GRPO update
WARM_START_STEP = 1

# (metric, what it measures, comparison, target): what the warm start should hand GRPO
WARM_START_TARGETS: tuple[tuple[str, str, str, float], ...] = (
    ("rollouts/parse_rate", "parse rate", ">=", 0.95),
    ("rollouts/multi_step_attempt_share", "multi-step share of all attempts", ">=", 0.35),
    ("rollouts/unequal_lists_rate", "unequal-length failures", "<=", 0.02),
)

# the metrics of the multi-step figure, with what a run that lacks them is told
MULTI_STEP_METRICS = {
    "rollouts/multi_step_attempt_share": "multi-step share of all attempts",
    "workflow/multi_step_share": "multi-step share of parsed workflows",
    "reward/multi_minus_single": "reward gap, multi-step minus single-step",
}

OLDER_RUN = "not logged by this run (an older run, from before the metric existed)"


def warm_start_check(history: pd.DataFrame, stage: str = "grpo") -> pd.DataFrame:
    """The warm start's rollouts against their targets (:data:`WARM_START_TARGETS`), read
    at ``<stage>`` step :data:`WARM_START_STEP`: one row per check with ``check``,
    ``metric`` (the history column), ``value`` (NaN when not logged), ``target``,
    ``comparison`` (``>=`` or ``<=``), ``met`` (True, False, or None when not logged) and
    ``missing`` (why there is no value, else "")."""
    columns = [c for c in history.columns if str(c).startswith(f"{stage}/")]
    logged = history.loc[history[columns].notna().any(axis=1), "step"] if columns else []
    if not len(logged):
        raise MissingInput(f"the training history has no '{stage}/…' metrics")
    at_step = history[history["step"] == WARM_START_STEP]
    if at_step.empty or not at_step[columns].notna().any(axis=None):
        raise MissingInput(
            f"the training history has no {stage} step {WARM_START_STEP} (its first logged "
            f"{stage} step is {int(min(logged))}): the warm start check reads the rollouts "
            "sampled before any GRPO update"
        )
    rows = []
    for metric, label, comparison, target in WARM_START_TARGETS:
        column = f"{stage}/{metric}"
        values = at_step[column].dropna() if column in at_step else pd.Series([], dtype=float)
        value = float(values.iloc[-1]) if len(values) else math.nan
        if math.isnan(value):
            met = None
            missing = (
                OLDER_RUN if column not in history else f"not logged at step {WARM_START_STEP}"
            )
        else:
            met = value >= target if comparison == ">=" else value <= target
            missing = ""
        rows.append(
            {
                "check": label,
                "metric": column,
                "value": value,
                "target": target,
                "comparison": comparison,
                "met": met,
                "missing": missing,
            }
        )
    return pd.DataFrame(rows)


def warm_start_section(history: pd.DataFrame) -> list[Any]:
    """One line on how many of the warm start's targets GRPO step 1 meets, then the table:
    each check's value at step 1 beside its target and whether it is met."""
    check = warm_start_check(history)
    judged = check[check["met"].notna()]
    line = (
        f"**Warm start check** (GRPO step {WARM_START_STEP}: its rollouts are sampled from the "
        "SFT warm start, before any GRPO update): "
    )
    if len(judged):
        met = judged["met"].astype(bool)
        line += f"{int(met.sum())} of {len(judged)} targets met"
        failed = judged.loc[~met, "check"].tolist()
        line += f"; not met: {', '.join(failed)}." if failed else "."
    else:
        line += "no target can be judged."
    lacking = check[check["met"].isna()]
    for reason, checks in lacking.groupby("missing", sort=False)["check"]:
        text = f"{', '.join(checks)}: {reason}"
        line += f" {text[0].upper()}{text[1:]}."
    table = pd.DataFrame(
        {
            "check": check["check"],
            f"step {WARM_START_STEP}": [
                "—" if math.isnan(v) else f"{100 * v:.1f}%" for v in check["value"]
            ],
            "target": [
                f"{'≥' if c == '>=' else '≤'} {100 * t:.0f}%"
                for c, t in zip(check["comparison"], check["target"], strict=True)
            ],
            "met": [
                "yes" if m is True else "no" if m is False else "not logged"  # the line says why
                for m in check["met"]
            ],
            "metric": check["metric"],
        }
    )
    return [line, table]


def _absent(history: pd.DataFrame, metric: str) -> str:
    """Why ``<stage>/<metric>`` draws no line: never logged by this run, or logged empty."""
    if any(f"{stage}/{metric}" in history for stage in STAGES):
        if metric == "reward/multi_minus_single":
            return "at no step did a group hold both single- and multi-step attempts"
        return "logged at no step"
    return OLDER_RUN


def multi_step_figure(history: pd.DataFrame):
    """Two panels over the training steps: the multi-step share of all attempts (parsed or
    not) and of the parsed workflows; and the reward gap of multi-step minus single-step
    attempts in the same groups, where a step had such a group, with a zero line. Returns
    the figure, followed by a note naming the metrics this history lacks, if any."""
    series = {metric: stage_series(history, metric) for metric in MULTI_STEP_METRICS}
    if not any(series.values()):
        raise MissingInput(
            "the training history has none of "
            + ", ".join(f"'<stage>/{m}'" for m in MULTI_STEP_METRICS)
            + f" ({OLDER_RUN})"
        )
    figure = new_figure(11.0, 3.8)
    share_ax = figure.add_subplot(1, 2, 1)
    _line_plot(share_ax, series["rollouts/multi_step_attempt_share"], "all attempts, parsed or not")
    _line_plot(
        share_ax, series["workflow/multi_step_share"], "parsed workflows only", linestyle="--"
    )
    share_ax.set_ylim(-0.05, 1.05)
    share_ax.set_ylabel("share with two or more steps")
    share_ax.set_title("Multi-step share per step", fontsize=10)
    gap_ax = figure.add_subplot(1, 2, 2)
    gap_ax.axhline(0.0, color="grey", linewidth=1)
    for stage, part in series["reward/multi_minus_single"].items():
        # points only: a step without a group holding both kinds of attempt has no value
        gap_ax.plot(
            part["step"], part["value"], marker="o", linestyle="none", label=f"reward gap ({stage})"
        )
    low, high = gap_ax.get_ylim() if series["reward/multi_minus_single"] else (-1.0, 1.0)
    gap_ax.set_ylim(min(low, -0.05), max(high, 0.05))  # the zero line always in view
    gap_ax.set_ylabel("mean reward, multi − single")
    gap_ax.set_title("Reward gap: multi-step minus single-step attempts (same groups)", fontsize=10)
    missing = {m: _absent(history, m) for m, s in series.items() if not s}
    for ax, metrics in (
        (share_ax, ("rollouts/multi_step_attempt_share", "workflow/multi_step_share")),
        (gap_ax, ("reward/multi_minus_single",)),
    ):
        absent = [m for m in metrics if m in missing]
        if absent:
            ax.text(
                0.5, 0.5, "\n".join(f"{MULTI_STEP_METRICS[m]}:\n{missing[m]}" for m in absent),
                transform=ax.transAxes, ha="center", va="center", fontsize=8, wrap=True,
                bbox={"facecolor": "white", "edgecolor": "none"},
            )  # fmt: skip
        if len(absent) < len(metrics):
            ax.legend(fontsize=8)
        _step_axis(ax)
        ax.grid(True, alpha=0.3)
    steps = stage_steps(history)
    if len(steps) and steps.max() > steps.min():  # both panels on the GRPO steps
        for ax in (share_ax, gap_ax):
            ax.set_xlim(steps.min() - 0.5, steps.max() + 0.5)
    figure.suptitle(
        "Does the Conductor try multi-step workflows, and does trying pay?", fontsize=11
    )
    figure.tight_layout()
    if not missing:
        return figure
    return [
        figure,
        "*Not drawn: "
        + "; ".join(f"{MULTI_STEP_METRICS[m]} (`{m}`), {why}" for m, why in missing.items())
        + ".*",
    ]
