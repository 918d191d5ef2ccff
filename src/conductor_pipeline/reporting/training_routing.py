"""What the Conductor learns per domain over training: who writes the answer (one stacked
panel per domain) and the workflow shapes."""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd

from conductor_pipeline.reporting.display import MissingInput, new_figure
from conductor_pipeline.reporting.training_curves import _step_axis
from conductor_pipeline.reporting.training_history import STAGES, stage_steps, worker_label


def _merged_stages(history: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """``columns`` maps history columns to names; one row per step where any is logged,
    stages merged (a later stage's value wins at a shared step), missing values 0."""
    frames = []
    for stage in STAGES:
        picked = [c for c in columns if c.startswith(f"{stage}/")]
        if picked:
            part = history[["step", *picked]].dropna(how="all", subset=picked)
            frames.append(part.rename(columns={c: columns[c] for c in picked}))
    merged = pd.concat(frames, ignore_index=True).groupby("step", as_index=False).last()
    return merged.fillna(0.0)


def answer_workers_by_domain(history: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``{domain: frame(step, <worker>...)}``: per step where the domain was sampled, the
    share of its parsed rollouts whose answer (last) step went to each worker."""
    pattern = re.compile(rf"^(?:{'|'.join(STAGES)})/domain/([^/]+)/worker/(.+)$")
    by_domain: dict[str, dict[str, str]] = {}
    for column in history.columns:
        match = pattern.match(str(column))
        if match:
            by_domain.setdefault(match.group(1), {})[column] = match.group(2)
    if not by_domain:
        raise MissingInput(
            "the training history has no '<stage>/domain/<domain>/worker/<worker>' metrics"
        )
    return {d: _merged_stages(history, cols) for d, cols in sorted(by_domain.items())}


def shape_history(history: pd.DataFrame) -> pd.DataFrame:
    """Per step: the share of parsed rollouts per workflow shape, and ``multi-step``."""
    columns = {}
    for column in history.columns:
        stage, _, rest = str(column).partition("/")
        if stage not in STAGES:
            continue
        if rest.startswith("shape/"):
            columns[column] = rest[len("shape/") :]
        elif rest == "workflow/multi_step_share":
            columns[column] = "multi-step"
    if not columns:
        raise MissingInput("the training history has no '<stage>/shape/<shape>' metrics")
    return _merged_stages(history, columns)


def _step_list(steps: list[int]) -> str:
    """``[3, 4, 5, 9]`` as "steps 3–5, 9"."""
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][-1] + 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    text = ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
    return ("step " if len(steps) == 1 else "steps ") + text


def panel_gaps(domain: str, shares: pd.DataFrame, steps: pd.Series) -> str:
    """Why part of a domain's panel is blank, or "": the training steps (``steps``) at which
    no share of the domain was logged (no rollout of it was sampled, or none parsed), and
    the steps whose shares fall short of the whole."""
    logged = {int(s) for s in shares["step"]}
    missing = sorted({int(s) for s in steps} - logged)
    workers = [c for c in shares.columns if c != "step"]
    totals = shares.set_index("step")[workers].sum(axis=1)
    short = sorted(int(s) for s, total in totals.items() if total < 0.995)
    reasons = []
    if missing:
        reasons.append(f"no {domain} answer shares logged at {_step_list(missing)}")
    if short:
        reasons.append(f"shares below 100% at {_step_list(short)}")
    return "; ".join(reasons)


def _answer_panel(
    ax, domain: str, shares: pd.DataFrame, colours: dict[str, Any], gaps: str = ""
) -> None:
    workers = [c for c in shares.columns if c != "step"]
    ax.stackplot(
        shares["step"],
        *[shares[w] for w in workers],
        colors=[colours[w] for w in workers],
        alpha=0.85,
    )
    ax.set_ylim(0, 1)
    _step_axis(ax)
    ax.set_title(f"{domain}: who writes the answer", fontsize=9)
    ax.set_ylabel("share of rollouts", fontsize=8)
    if gaps:  # a blank stretch says what is missing there
        ax.text(
            0.5, 0.02, f"Blank: {gaps}", transform=ax.transAxes, ha="center", va="bottom",
            fontsize=7, wrap=True, bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none"},
        )  # fmt: skip


def _shape_panel(ax, shapes: pd.DataFrame) -> None:
    for shape in [c for c in shapes.columns if c not in ("step", "multi-step")]:
        if shapes[shape].max() > 0:
            ax.plot(shapes["step"], shapes[shape], marker=".", label=shape)
    if "multi-step" in shapes:
        ax.plot(shapes["step"], shapes["multi-step"], "k--", label="multi-step")
    ax.set_ylim(-0.05, 1.05)
    _step_axis(ax)
    ax.set_title("Workflow shapes (all domains)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)


def routing_figure(history: pd.DataFrame):
    """What the Conductor learns over training: for each domain, the share of rollouts whose
    answer step goes to each worker (stacked), and one panel of workflow-shape shares."""
    by_domain = answer_workers_by_domain(history)
    try:
        shapes = shape_history(history)
    except MissingInput:
        shapes = None
    panels = len(by_domain) + (shapes is not None)
    ncols = min(3, panels)
    nrows = math.ceil(panels / ncols)
    figure = new_figure(4.2 * ncols, 3.0 * nrows + 0.6)
    workers = list(dict.fromkeys(w for f in by_domain.values() for w in f.columns if w != "step"))
    palette = [f"C{i}" for i in range(10)]
    colours = {w: palette[i % len(palette)] for i, w in enumerate(workers)}
    steps = stage_steps(history)  # the GRPO steps, not the SFT steps logged alongside
    for i, (domain, shares) in enumerate(by_domain.items()):
        gaps = panel_gaps(domain, shares, steps)
        _answer_panel(figure.add_subplot(nrows, ncols, i + 1), domain, shares, colours, gaps)
    if shapes is not None:
        _shape_panel(figure.add_subplot(nrows, ncols, panels), shapes)
    first, last = (steps.min(), steps.max()) if len(steps) else (0, 0)
    if last > first:  # one step axis for every panel, though a domain is not sampled each step
        for ax in figure.axes:
            ax.set_xlim(first, last)
    from matplotlib.patches import Patch

    figure.legend(
        handles=[Patch(color=colours[w], label=worker_label(w)) for w in workers],
        loc="lower center",
        ncol=min(len(workers), 4),
        fontsize=7,
    )
    figure.tight_layout(rect=(0, 0.08 if nrows == 1 else 0.05, 1, 1))
    return figure
