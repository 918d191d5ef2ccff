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


def pareto_figure(summary: pd.DataFrame, *, title: str = "Cost and accuracy per system"):
    """A matplotlib ``Figure`` (Agg backend, no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 6), dpi=120)
    ax = figure.add_subplot(1, 1, 1)
    rows = summary.dropna(subset=["accuracy", "cost_usd_per_q"])
    positive = rows["cost_usd_per_q"][rows["cost_usd_per_q"] > 0]
    floor = float(positive.min()) / 2 if len(positive) else 1e-6
    front = pareto_front(rows)
    for row in rows.to_dict(orient="records"):
        system = row["system"]
        x = max(float(row["cost_usd_per_q"]), floor)
        y = float(row["accuracy"])
        low = y - row["ci_low"] if not math.isnan(row["ci_low"]) else 0.0
        high = row["ci_high"] - y if not math.isnan(row["ci_high"]) else 0.0
        if system.startswith("conductor") or system == "base-policy":
            style = {
                "marker": "*",
                "markersize": 14,
                "color": "tab:red" if system.startswith("conductor") else "tab:purple",
            }
        elif system == "oracle":
            style = {"marker": "o", "markersize": 8, "markerfacecolor": "none", "color": "grey"}
        else:
            style = {"marker": "o", "markersize": 7, "color": "tab:blue"}
        ax.errorbar(
            [x], [y], yerr=[[max(low, 0)], [max(high, 0)]], capsize=3, linestyle="none", **style
        )
        ax.annotate(
            _label(system) + (" — upper bound" if system == "oracle" else ""),
            (x, y),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=8,
        )
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
