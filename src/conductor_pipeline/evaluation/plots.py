"""The cost–accuracy plot: every system at its cost per question (log scale) and accuracy,
with its confidence interval, the Pareto front drawn through the systems nothing beats on
both, and simulated workers labelled as such."""

from __future__ import annotations

import math

import pandas as pd

from conductor_pipeline.evaluation.metrics import pareto_front


def _label(system: str) -> str:
    worker = system.split(":", 1)[1] if ":" in system else ""
    return f"{system} (simulated)" if worker.startswith("sim-") else system


# roughly how wide one character of a label is on the log axis, to keep labels apart
_DECADES_PER_CHAR = 0.022


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
    placed: list[tuple[float, float, float, int]] = []  # (x from, x to in decades, y, level)
    for (cost, accuracy), members in sorted(groups.items()):
        x, y = max(cost, floor), accuracy
        for row in members:
            _draw_point(ax, row, x, y)
        names = [
            _label(r["system"]) + (" — upper bound" if r["system"] == "oracle" else "")
            for r in members
        ]
        label = ", ".join(names) + (" ($0: no worker calls)" if cost <= 0 else "")
        start = math.log10(x)
        end = start + _DECADES_PER_CHAR * len(label)
        level = 0
        while any(
            lvl == level and abs(py - y) < 0.045 and start < p_end and p_start < end
            for p_start, p_end, py, lvl in placed
        ):
            level += 1
        placed.append((start, end, y, level))
        ax.annotate(
            label, (x, y), textcoords="offset points", xytext=(6, 4 - 10 * level), fontsize=7
        )
    if placed:
        ax.set_xlim(floor / 2, 10 ** max(p_end for _, p_end, _, _ in placed))
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
    return figure
