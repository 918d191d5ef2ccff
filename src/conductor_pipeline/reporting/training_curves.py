"""The training report's curves over the steps: reward, parse rate (with the curriculum's
share), worker usage, cost per rollout, and the warm start's SFT loss. Two series that are
the same draw one line under both names, and a series that never changes is a note with its
value, not a flat line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from conductor_pipeline.reporting.display import MissingInput, new_figure
from conductor_pipeline.reporting.training_history import (
    STAGES,
    _read_table,
    _require,
    stage_series,
)

# the training reward (correctness minus a cost penalty, floored) lies in this range
REWARD_RANGE = (0.0, 1.0)


def _line_plot(ax, series: dict[str, pd.DataFrame], label: str, **style: Any) -> None:
    for stage, part in series.items():
        ax.plot(part["step"], part["value"], marker=".", label=f"{label} ({stage})", **style)


def _step_axis(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")


Line = tuple[str, pd.DataFrame]  # a label and its frame(step, value)


def _same(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    import numpy as np

    return list(a["step"]) == list(b["step"]) and bool(
        np.allclose(a["value"].to_numpy(float), b["value"].to_numpy(float), rtol=1e-9, atol=1e-12)
    )


def _constant(part: pd.DataFrame) -> bool:
    values = part["value"].to_numpy(float)
    return len(values) > 1 and float(values.max() - values.min()) <= 1e-12 * max(
        1.0, float(abs(values).max())
    )


def distinct_lines(lines: list[Line]) -> tuple[list[Line], list[str]]:
    """The lines worth drawing and the notes that replace the others: a series equal to an
    earlier one at every step is drawn once, labelled with both names; a series that never
    changes becomes a note with its value."""
    kept: list[Line] = []
    notes: list[str] = []
    for label, part in lines:
        twin = next((i for i, (_, other) in enumerate(kept) if _same(part, other)), None)
        if twin is not None:
            kept[twin] = (f"{kept[twin][0]} = {label} (identical)", kept[twin][1])
            continue
        if _constant(part):
            first, last = int(part["step"].iloc[0]), int(part["step"].iloc[-1])
            notes.append(
                f"{label}: {float(part['value'].iloc[0]):.6g} at every step ({first}–{last}), "
                "not drawn"
            )
            continue
        kept.append((label, part))
    return kept, notes


def _stage_lines(history: pd.DataFrame, metric: str, label: str) -> list[Line]:
    return [(f"{label} ({stage})", part) for stage, part in stage_series(history, metric).items()]


def _with_notes(figure: Any, notes: list[str]) -> Any:
    if not notes:
        return figure
    text = "*" + "; ".join(notes) + ".*"
    return [text] if figure is None else [figure, text]


def reward_figure(history: pd.DataFrame):
    """Mean reward per step (± one standard deviation), and the correctness part of it.
    Correctness equal to the reward at every step (no cost penalty paid) is one line under
    both names; a constant series is a note (:func:`distinct_lines`)."""
    mean = _require(history, "reward/mean")
    std = stage_series(history, "reward/std")
    lines, notes = distinct_lines(
        _stage_lines(history, "reward/mean", "mean reward")
        + _stage_lines(history, "reward/correctness_mean", "correctness")
    )
    if not lines:
        return _with_notes(None, notes)
    figure = new_figure()
    ax = figure.add_subplot(1, 1, 1)
    bands = {f"mean reward ({stage})": stage for stage in mean}
    for label, part in lines:
        is_mean = label.split(" = ")[0] in bands
        ax.plot(
            part["step"], part["value"], marker=".", label=label,
            linestyle="-" if is_mean else "--",
        )  # fmt: skip
        stage = bands.get(label.split(" = ")[0])
        if stage in std:
            merged = part.merge(std[stage], on="step", suffixes=("", "_std"))
            # the reward lives in [0, 1]; a band past it would show rewards no rollout can get
            low, high = REWARD_RANGE
            ax.fill_between(
                merged["step"],
                (merged["value"] - merged["value_std"]).clip(low, high),
                (merged["value"] + merged["value_std"]).clip(low, high),
                alpha=0.15,
            )
    _step_axis(ax)
    ax.set_ylabel("reward")
    ax.set_ylim(REWARD_RANGE[0] - 0.05, REWARD_RANGE[1] + 0.05)
    ax.set_title(
        "Reward per GRPO step (band: ± one standard deviation across rollouts, within [0, 1])"
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    figure.tight_layout()
    return _with_notes(figure, notes)


def parse_rate_figure(history: pd.DataFrame):
    """Share of rollouts that were a valid workflow, the accuracy of those scored and, in a
    run with a curriculum, the share of rollouts whose question the reference worker got
    wrong: the accuracy falls where a step drew more of them, not only where the policy
    got worse."""
    parse = _require(history, "rollouts/parse_rate")
    figure = new_figure()
    ax = figure.add_subplot(1, 1, 1)
    _line_plot(ax, parse, "parse rate")
    _line_plot(ax, stage_series(history, "rollouts/accuracy"), "accuracy of scored rollouts")
    drawn = stage_series(history, "curriculum/unsolved_share")
    _line_plot(ax, drawn, "curriculum: questions the reference worker got wrong", linestyle=":")
    ax.set_ylim(-0.05, 1.05)
    _step_axis(ax)
    ax.set_ylabel("share of rollouts")
    ax.set_title(
        "Workflow parse rate and rollout accuracy"
        + (", with the curriculum's share" if drawn else "")
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    figure.tight_layout()
    return figure


def worker_usage(history: pd.DataFrame) -> pd.DataFrame:
    """Per step, the share of workflow steps given to each worker (columns = workers)."""
    marker = "/workers/share/"
    columns = [c for c in history.columns if marker in c]
    if not columns:
        raise MissingInput("the training history has no '<stage>/workers/share/<worker>' metrics")
    frames = []
    for stage in STAGES:
        picked = [c for c in columns if c.startswith(f"{stage}{marker}")]
        if not picked:
            continue
        part = history[["step", *picked]].dropna(how="all", subset=picked)
        part = part.rename(columns={c: c.split(marker, 1)[1] for c in picked})
        frames.append(part)
    usage = pd.concat(frames, ignore_index=True).groupby("step", as_index=False).last()
    return usage.fillna(0.0)


def worker_usage_figure(history: pd.DataFrame):
    usage = worker_usage(history)
    workers = [c for c in usage.columns if c != "step"]
    figure = new_figure()
    ax = figure.add_subplot(1, 1, 1)
    ax.stackplot(
        usage["step"],
        *[usage[w] for w in workers],
        labels=[f"{w} (simulated)" if w.startswith("sim-") else w for w in workers],
        alpha=0.85,
    )
    ax.set_ylim(0, 1)
    _step_axis(ax)
    ax.set_ylabel("share of workflow steps")
    ax.set_title("Which workers the Conductor calls during training")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    return figure


def cost_figure(history: pd.DataFrame):
    """Worker cost per rollout (list price) and steps per workflow. The cost at list price
    equal to the cost paid (no cache hits) is one line under both names; a series that never
    changes (often the steps) is a note with its value (:func:`distinct_lines`)."""
    _require(history, "workflow/cost_usd_mean")
    costs, notes = distinct_lines(
        _stage_lines(history, "workflow/cost_usd_mean", "worker cost per rollout (USD)")
        + _stage_lines(history, "workflow/list_cost_usd_mean", "at list price, cache hits included")
    )
    steps, step_notes = distinct_lines(
        _stage_lines(history, "workflow/steps_mean", "steps per workflow")
    )
    notes += step_notes
    if not costs and not steps:
        return _with_notes(None, notes)
    figure = new_figure()
    ax = figure.add_subplot(1, 1, 1)
    for i, (label, part) in enumerate(costs):
        ax.plot(part["step"], part["value"], marker=".", label=label,
                linestyle="-" if i == 0 else ":")  # fmt: skip
    _step_axis(ax)
    ax.set_ylabel("USD per rollout")
    if steps:
        twin = ax.twinx() if costs else ax
        for label, part in steps:
            twin.plot(part["step"], part["value"], color="grey", alpha=0.6, label=label)
        twin.set_ylabel("workflow steps (grey)")
        if not costs:
            ax.legend(fontsize=8, loc="upper left")
    ax.set_title("Cost per rollout over training")
    ax.grid(True, alpha=0.3)
    if costs:
        ax.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    return _with_notes(figure, notes)


def sft_loss(
    history: pd.DataFrame | None,
    adapter_info: dict[str, Any] | None = None,
    sft_history_path: str | Path | None = None,
) -> tuple[pd.DataFrame, str]:
    """The warm start's loss per step as ``frame(step, loss)`` and where it came from.

    Sources, first found wins: the MLflow metric ``sft/loss`` (in ``history``), a per-step
    table at ``sft_history_path`` (columns ``step`` and ``loss`` or ``sft/loss``), the
    ``history`` records of the adapter info's ``sft`` entry. Raises :class:`MissingInput`
    naming what is there instead (often only ``sft/final_loss``)."""
    if history is not None and "sft/loss" in history:
        part = history[["step", "sft/loss"]].dropna()
        if len(part):
            return part.rename(columns={"sft/loss": "loss"}).reset_index(drop=True), (
                "the MLflow metric sft/loss"
            )
    if sft_history_path and Path(sft_history_path).is_file():
        table = _read_table(sft_history_path)
        column = next((c for c in ("loss", "sft/loss") if c in table), None)
        if column and "step" in table and len(table.dropna(subset=[column])):
            part = table[["step", column]].dropna().rename(columns={column: "loss"})
            return part.sort_values("step").reset_index(drop=True), str(sft_history_path)
    sft = (adapter_info or {}).get("sft") or {}
    records = sft.get("history") if isinstance(sft, dict) else None
    if records:
        table = pd.DataFrame(records)
        if {"step", "loss"} <= set(table.columns) and len(table.dropna(subset=["loss"])):
            part = table[["step", "loss"]].dropna().sort_values("step")
            return part.reset_index(drop=True), "the adapter info's SFT history"
    final = sft.get("final_loss") if isinstance(sft, dict) else None
    if sft.get("reused"):
        raise MissingInput("no SFT loss curve: the warm start was reused from an earlier run")
    detail = (
        f"only the final loss ({float(final):.3f} after {sft.get('steps')} steps) was recorded"
        if isinstance(final, int | float)
        else "no SFT loss was recorded"
    )
    raise MissingInput(
        f"no SFT loss curve: this run logged no per-step SFT loss (MLflow metric sft/loss); "
        f"{detail}"
    )


def sft_loss_figure(
    history: pd.DataFrame | None,
    adapter_info: dict[str, Any] | None = None,
    sft_history_path: str | Path | None = None,
):
    """The warm start's (SFT) training loss per step."""
    loss, source = sft_loss(history, adapter_info, sft_history_path)
    figure = new_figure(8.0, 3.6)
    ax = figure.add_subplot(1, 1, 1)
    ax.plot(loss["step"], loss["loss"], marker=".", label="SFT loss")
    _step_axis(ax)
    ax.set_xlabel("SFT step")
    ax.set_ylabel("loss (completion tokens)")
    ax.set_title(f"Warm start: SFT loss per step (from {source})", fontsize=10)
    ax.grid(True, alpha=0.3)
    figure.tight_layout()
    return figure
