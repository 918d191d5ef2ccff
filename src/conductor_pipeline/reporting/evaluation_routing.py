"""Who does what in the evaluated workflows: accuracy and worker choice per domain (heat
maps), who writes the answer, the workflow shapes and access patterns, and the one sentence
that replaces those panels when every workflow is single-step."""

from __future__ import annotations

import math

import pandas as pd

from conductor_pipeline.evaluation.config import CONDUCTOR_SYSTEMS

# ``step_workers``: the evaluation's own reader of the ``workers`` column it writes, so the
# report counts workflow steps exactly as the summary's usage shares do
from conductor_pipeline.evaluation.metrics import step_workers
from conductor_pipeline.reporting.display import MissingInput, new_figure
from conductor_pipeline.reporting.evaluation_inputs import sim_label, system_label

PATTERNS = ("single", "chain", "independent", "tree")


def _draw_heatmap(ax, matrix: pd.DataFrame, *, percent: bool = True):
    """Annotated shares in [0, 1] on ``ax``; returns the image (for a colour bar)."""
    import numpy as np

    values = matrix.to_numpy(dtype=float)
    image = ax.imshow(
        np.ma.masked_invalid(values), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto"
    )
    ax.set_xticks(range(matrix.shape[1]))
    ax.set_xticklabels([str(c) for c in matrix.columns], rotation=35, ha="right", fontsize=8)
    ax.set_yticks(range(matrix.shape[0]))
    ax.set_yticklabels([str(i) for i in matrix.index], fontsize=8)
    for (row, col), value in np.ndenumerate(values):
        if math.isnan(value):
            continue
        text = f"{100 * value:.0f}" if percent else f"{value:.2f}"
        ax.text(
            col, row, text, ha="center", va="center", fontsize=7,
            color="white" if value < 0.6 else "black",
        )  # fmt: skip
    return image


def heatmap_figure(matrix: pd.DataFrame, *, title: str, value_label: str, percent: bool = True):
    """Rows × columns of shares in [0, 1], annotated."""
    width = max(6.0, 1.0 + 0.9 * matrix.shape[1])
    height = max(2.5, 0.9 + 0.5 * matrix.shape[0])
    figure = new_figure(width, height)
    ax = figure.add_subplot(1, 1, 1)
    image = _draw_heatmap(ax, matrix, percent=percent)
    figure.colorbar(image, ax=ax, label=value_label)
    ax.set_title(title, fontsize=10)
    figure.tight_layout()
    return figure


def domain_accuracy(by_domain: pd.DataFrame) -> pd.DataFrame:
    """Accuracy per domain (rows) and system (columns, in the summary's order)."""
    if by_domain.empty:
        raise MissingInput("the per-domain summary is empty")
    order = list(dict.fromkeys(by_domain["system"]))
    matrix = by_domain.pivot_table(index="domain", columns="system", values="accuracy")
    return matrix[[s for s in order if s in matrix.columns]]


def domain_accuracy_figure(by_domain: pd.DataFrame):
    matrix = domain_accuracy(by_domain)
    matrix.columns = [system_label(c) for c in matrix.columns]
    return heatmap_figure(matrix, title="Accuracy by domain and system (%)", value_label="accuracy")


def worker_choice(results: pd.DataFrame, system: str = "conductor") -> pd.DataFrame:
    """Share of the ``system``'s workflow steps given to each worker, per domain."""
    rows = results[results["system"] == system]
    records = [
        {"domain": domain, "worker": worker}
        for domain, workers in zip(rows["domain"], rows["workers"], strict=True)
        for worker in step_workers(workers)
    ]
    if not records:
        raise MissingInput(f"no executed workflow steps for system {system!r}")
    counts = pd.DataFrame(records).value_counts().unstack(fill_value=0)
    return counts.div(counts.sum(axis=1), axis=0)


def worker_choice_figure(results: pd.DataFrame, system: str = "conductor"):
    matrix = worker_choice(results, system)
    matrix.columns = [f"{c} (sim)" if str(c).startswith("sim-") else c for c in matrix.columns]
    return heatmap_figure(
        matrix,
        title=f"Which workers the {system} calls, by domain (% of its workflow steps)",
        value_label="share of steps",
    )


# the systems compared side by side in the routing heat map: what GRPO changed
ROUTING_SYSTEMS = ("conductor", "warm-start")


def routing(results: pd.DataFrame) -> pd.DataFrame:
    """The evaluation's routing table (``evaluation_routing.csv``), from the per-question
    results the report already holds."""
    from conductor_pipeline.evaluation import routing_table

    table = routing_table(results)
    if table.empty:
        raise MissingInput("no Conductor workflows in the results")
    return table


def answer_routing(table: pd.DataFrame, system: str) -> pd.DataFrame:
    """Per domain (rows, all domains last): the share of questions whose answer step went
    to each worker (columns, pool order), then the share of multi-step workflows.
    ``(no workflow)`` is a column only where some question had none."""
    from conductor_pipeline.evaluation.routing import ALL_DOMAINS, MULTI_STEP, NO_WORKFLOW

    mine = table[table["system"] == system]
    workers = mine[mine["kind"] == "worker"]
    if workers.empty:
        raise MissingInput(f"no routing rows for system {system!r}")
    matrix = workers.pivot(index="domain", columns="value", values="share")
    columns = list(dict.fromkeys(workers["value"]))
    if not (matrix[NO_WORKFLOW] > 0).any():
        columns.remove(NO_WORKFLOW)
    multi = mine[(mine["kind"] == "workflow") & (mine["value"] == MULTI_STEP)]
    matrix = matrix[columns].assign(**{"multi-step": multi.set_index("domain")["share"]})
    domains = sorted(d for d in matrix.index if d != ALL_DOMAINS)
    return matrix.loc[[*domains, ALL_DOMAINS] if ALL_DOMAINS in matrix.index else domains]


def routing_figure(results: pd.DataFrame, systems: tuple[str, ...] = ROUTING_SYSTEMS):
    """Heat maps side by side, one per system: rows domains, columns the worker that wrote
    the answer (share of questions), then the multi-step share."""
    table = routing(results)
    shown = [s for s in systems if s in set(table["system"])]
    if not shown:
        raise MissingInput(f"no routing rows for {', '.join(systems)}")
    matrices = [answer_routing(table, s) for s in shown]
    # with no multi-step workflow at all that column is all zeros: the structure section
    # says so once (workflow_structure), the heat map leaves it out
    multi = any((m["multi-step"].fillna(0) > 0).any() for m in matrices)
    if not multi:
        matrices = [m.drop(columns="multi-step") for m in matrices]
    columns = max(m.shape[1] for m in matrices)
    rows = max(m.shape[0] for m in matrices)
    figure = new_figure(max(6.0, (1.2 + 0.75 * columns) * len(shown)), max(2.8, 1.4 + 0.45 * rows))
    image = None
    for i, (system, matrix) in enumerate(zip(shown, matrices, strict=True)):
        ax = figure.add_subplot(1, len(shown), i + 1)
        matrix = matrix.rename(columns=sim_label)
        image = _draw_heatmap(ax, matrix)
        if multi:
            ax.axvline(matrix.shape[1] - 1.5, color="white", linewidth=3)  # workers | multi-step
        ax.set_title(system, fontsize=10)
        if i:
            ax.set_yticklabels([])
    figure.colorbar(image, ax=figure.axes, label="share of questions", shrink=0.9)
    figure.suptitle(
        "Who writes the answer (% of questions per domain), and how often the workflow has "
        "more than one step"
        if multi
        else "Who writes the answer (% of questions per domain)",
        fontsize=10,
        y=1.04,
    )
    return figure


def shape_shares(results: pd.DataFrame) -> pd.DataFrame:
    """Per Conductor system over all domains: % of questions per workflow shape (single,
    solve_check, parallel_aggregate, chain, independent, other, no workflow) and % of
    multi-step workflows."""
    from conductor_pipeline.evaluation.routing import ALL_DOMAINS

    table = routing(results)
    overall = table[(table["domain"] == ALL_DOMAINS) & (table["kind"] != "worker")]
    matrix = overall.pivot(index="system", columns="value", values="share")
    columns = list(dict.fromkeys(overall["value"]))
    order = [s for s in CONDUCTOR_SYSTEMS if s in matrix.index]
    shares = (100 * matrix.loc[order, columns]).round(1)
    shares.insert(0, "questions", overall.groupby("system")["n"].first().loc[order])
    shares = shares.rename(columns={"multi_step": "multi-step"}).reset_index()
    shares.columns.name = None  # the pivot's "value": no header of its own
    return shares


def access_patterns(results: pd.DataFrame) -> pd.DataFrame:
    """Share of workflows per access pattern (single, chain, independent, tree) for the
    systems that write workflows; rows are systems."""
    rows = results[results["system"].isin(CONDUCTOR_SYSTEMS) & results["access_pattern"].notna()]
    if rows.empty:
        raise MissingInput("no workflows with an access pattern in the results")
    shares = pd.crosstab(rows["system"], rows["access_pattern"], normalize="index")
    for pattern in PATTERNS:
        if pattern not in shares:
            shares[pattern] = 0.0
    extra = [c for c in shares.columns if c not in PATTERNS]
    order = [s for s in CONDUCTOR_SYSTEMS if s in shares.index]
    shares = shares.loc[order, [*PATTERNS, *extra]]
    shares.columns.name = None  # crosstab's "access_pattern"
    return shares


def access_pattern_figure(results: pd.DataFrame):
    """Stacked bars of :func:`access_patterns`, each share written on its bar (the figure is
    the section's only view of these numbers)."""
    shares = access_patterns(results)
    figure = new_figure(8, 3.2)
    ax = figure.add_subplot(1, 1, 1)
    left = pd.Series(0.0, index=shares.index)
    for pattern in shares.columns:
        bars = ax.barh(shares.index, shares[pattern], left=left, label=pattern)
        labels = [f"{100 * v:.0f}%" if v >= 0.06 else "" for v in shares[pattern]]
        ax.bar_label(bars, labels=labels, label_type="center", fontsize=8)
        left += shares[pattern]
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of workflows")
    ax.set_title("Access patterns of the workflows (who sees which earlier steps)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    return figure


# --- when every workflow is single-step ------------------------------------------------------


def workflow_systems(results: pd.DataFrame) -> list[str]:
    """The systems that wrote workflows in ``results``, in :data:`CONDUCTOR_SYSTEMS` order."""
    present = set(results.loc[results["n_steps"].notna(), "system"])
    return [s for s in CONDUCTOR_SYSTEMS if s in present]


def single_step_everywhere(results: pd.DataFrame) -> bool:
    """True when the systems that write workflows wrote some, and every one is single-step:
    then worker choice equals who writes the answer, and the shape and access-pattern panels
    would only say "single" again."""
    rows = results[results["system"].isin(CONDUCTOR_SYSTEMS) & results["n_steps"].notna()]
    return bool(len(rows)) and bool((rows["n_steps"] <= 1).all())


# the sections that only repeat "every workflow is single-step", with why
SINGLE_STEP_REDUNDANT = {
    "Worker choice by domain": "its one step is the answer step, so it equals the answer routing",
    "Workflow shapes (% of questions)": "every shape is single",
    "Access patterns": "a single step sees no earlier step",
}


def workflow_structure(results: pd.DataFrame) -> list[str]:
    """The section stating, once, that every workflow is single-step, and which panels are
    left out because of it (:data:`SINGLE_STEP_REDUNDANT`). Raises :class:`MissingInput`
    when some workflow has more than one step (the panels then show the structure)."""
    if not single_step_everywhere(results):
        raise MissingInput("some workflows have more than one step")
    systems = workflow_systems(results)
    names = " and ".join(f"the {s}" for s in systems)
    n = int(results[results["system"].isin(systems) & results["n_steps"].notna()].shape[0])
    skipped = "; ".join(f"{title.split(' (')[0].lower()} ({why})" for title, why in
                        SINGLE_STEP_REDUNDANT.items())  # fmt: skip
    return [
        f"**Every workflow is single-step:** all {n} workflows {names} wrote call one worker, "
        "which answers the question alone.",
        f"*Not shown, as they would only repeat this: {skipped}.*",
    ]
