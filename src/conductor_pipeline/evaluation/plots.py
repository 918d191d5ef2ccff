"""The cost–accuracy plot: every system at its cost per question (log scale) and accuracy,
with its confidence interval, the Pareto front drawn through the systems nothing beats on
both, simulated workers labelled as such and a kind's ``label_note`` added to its name."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from conductor_pipeline.evaluation.metrics import pareto_front
from conductor_pipeline.evaluation.registry import label_note


def _label(system: str) -> str:
    worker = system.split(":", 1)[1] if ":" in system else ""
    if worker.startswith("sim-"):
        return f"{system} (simulated)"
    note = label_note(system)
    return f"{system} ({note})" if note else system


# roughly how wide one character of a label is on the log axis (to leave room on the right)
_DECADES_PER_CHAR = 0.022
# where a label may go relative to its point, in points (dx, dy, horizontal alignment):
# right of it first, then left, then further up or down, nearest first
_OFFSETS = [
    (dx, dy, "left" if dx > 0 else "right")
    for dy in (3, -11, 13, -21, 23, -31, 33, -41, 43, -51)
    for dx in (7, -7)
]
# how much each kind of overlap costs a candidate place (a label over a label is worst)
_OVER_LABEL, _OUTSIDE, _OVER_MARKER, _OVER_BAR = 100.0, 50.0, 20.0, 1.0


def _overlap(a, b) -> float:
    """Area shared by two display-space boxes (0 when apart)."""
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return width * height if width > 0 and height > 0 else 0.0


def place_labels(ax, points: list[tuple[float, float, str]], bars: list[tuple]) -> list:
    """Annotate each ``(x, y, label)`` at the free place nearest its point: labels never on
    top of another label when a free place exists, and preferably off the other markers and
    error bars (``bars``: ``(x, y_low, y_high)`` in data coordinates). Returns the texts.

    Positions are measured on the rendered figure (text extents in pixels), so call it
    after the axes' limits and layout are final."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.transforms import Bbox

    figure = ax.figure
    if not isinstance(figure.canvas, FigureCanvasAgg):
        FigureCanvasAgg(figure)
    renderer = figure.canvas.get_renderer()
    to_px = ax.transData.transform
    pad = 5.0 * figure.dpi / 72.0  # half a marker, in pixels
    markers = [
        Bbox.from_extents(*(to_px((x, y)) - pad), *(to_px((x, y)) + pad)) for x, y, _ in points
    ]
    bar_boxes = []
    for x, low, high in bars:
        (bx, by0), (_, by1) = to_px((x, low)), to_px((x, high))
        bar_boxes.append(Bbox.from_extents(bx - 2, by0, bx + 2, by1))
    frame = ax.get_window_extent(renderer)
    legend = ax.get_legend()
    if legend is not None:  # the legend box is as much in the way as a marker
        markers.append(legend.get_window_extent(renderer))
    placed: list = []
    texts = []
    # the crowded middle first would leave the edges no room; top to bottom reads naturally
    order = sorted(range(len(points)), key=lambda k: -points[k][1])
    for k in order:
        x, y, label = points[k]
        best: tuple[float, tuple[int, int, str], Any] | None = None
        for dx, dy, align in _OFFSETS:
            probe = ax.annotate(
                label, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=7,
                ha=align, va="bottom",
            )  # fmt: skip
            box = probe.get_window_extent(renderer).padded(1.5)
            probe.remove()
            cost = _OVER_LABEL * sum(_overlap(box, other) for other in placed)
            cost += _OVER_MARKER * sum(_overlap(box, m) for i, m in enumerate(markers) if i != k)
            cost += _OVER_BAR * sum(_overlap(box, b) for b in bar_boxes)
            cost += _OUTSIDE * max(box.width * box.height - _overlap(box, frame), 0.0)
            cost += 0.5 * abs(dy)  # nearer its point reads better, all else equal
            if best is None or cost < best[0]:
                best = (cost, (dx, dy, align), box)
            if cost <= 0.5 * abs(dy):  # nothing in the way: no need to look further
                break
        assert best is not None
        _, (dx, dy, align), box = best
        # far from its point, a thin line says whose label it is
        arrow = {"arrowstyle": "-", "color": "grey", "linewidth": 0.5} if abs(dy) > 13 else None
        text = ax.annotate(
            label, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=7,
            ha=align, va="bottom", arrowprops=arrow,
        )  # fmt: skip
        placed.append(box)
        texts.append(text)
    return texts


def _draw_point(ax, row: dict, x: float, y: float) -> None:
    system = row["system"]
    low = y - row["ci_low"] if not math.isnan(row["ci_low"]) else 0.0
    high = row["ci_high"] - y if not math.isnan(row["ci_high"]) else 0.0
    if system.startswith("conductor"):
        style = {"marker": "*", "markersize": 14, "color": "tab:red"}
    elif system == "base-policy":
        style = {"marker": "*", "markersize": 11, "color": "tab:purple"}
    elif system == "warm-start":
        style = {"marker": "*", "markersize": 11, "color": "tab:orange"}
    elif system == "oracle":
        style = {"marker": "o", "markersize": 8, "markerfacecolor": "none", "color": "grey"}
    else:
        style = {"marker": "o", "markersize": 7, "color": "tab:blue"}
    ax.errorbar(
        [x], [y], yerr=[[max(low, 0)], [max(high, 0)]], capsize=3, linestyle="none", **style
    )


def pareto_figure(summary: pd.DataFrame, *, title: str = "Cost and accuracy per system"):
    """A matplotlib ``Figure`` (Agg backend, no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 6.5), dpi=120)
    ax = figure.add_subplot(1, 1, 1)
    rows = summary.dropna(subset=["accuracy", "cost_usd_per_q"])
    positive = rows["cost_usd_per_q"][rows["cost_usd_per_q"] > 0]
    floor = float(positive.min()) / 2 if len(positive) else 1e-6
    front = pareto_front(rows)
    # systems at the same point share one label; labels of nearby points are staggered
    groups: dict[tuple[float, float], list[dict]] = {}
    for row in rows.to_dict(orient="records"):
        key = (round(float(row["cost_usd_per_q"]), 12), round(float(row["accuracy"]), 6))
        groups.setdefault(key, []).append(row)
    labels: list[tuple[float, float, str]] = []
    bars: list[tuple[float, float, float]] = []
    for (cost, accuracy), members in sorted(groups.items()):
        x, y = max(cost, floor), accuracy
        for row in members:
            _draw_point(ax, row, x, y)
            if not math.isnan(row["ci_low"]) and not math.isnan(row["ci_high"]):
                bars.append((x, float(row["ci_low"]), float(row["ci_high"])))
        names = [
            _label(r["system"]) + (" — upper bound" if r["system"] == "oracle" else "")
            for r in members
        ]
        labels.append((x, y, ", ".join(names) + (" ($0: no worker calls)" if cost <= 0 else "")))
    if labels:
        widest = max(math.log10(x) + _DECADES_PER_CHAR * len(t) for x, _, t in labels)
        ax.set_xlim(floor / 2, 10**widest)
    points = rows.set_index("system").loc[front]
    if len(points) > 0:
        ax.step(
            [max(c, floor) for c in points["cost_usd_per_q"]],
            points["accuracy"],
            where="post",
            color="tab:green",
            alpha=0.6,
            label="Pareto front",
        )
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("worker cost per question (USD, log scale; cache hits at list price)")
    ax.set_ylabel("accuracy (95 % bootstrap CI)")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(True, which="both", alpha=0.3)
    simulated = bool(summary.get("simulated_pool", pd.Series([False])).any())
    ax.set_title(
        title + (" — sandbox pool with simulated workers" if simulated else ""), fontsize=10
    )
    figure.tight_layout()
    # labels last: their places are measured on the final layout
    place_labels(ax, labels, bars)
    return figure
