"""The evaluation report's content: the summary table with confidence intervals, the
cost–accuracy plot, a warning under the summary for benchmarks whose verdicts the code
under test could forge (BigCodeBench), per-domain heat maps of accuracy and of the Conductor's worker choice,
how the Conductor and its warm start plan per domain and difficulty, access-pattern shares, sample workflows that succeeded and failed, the promotion
decision against the previous champion, and the best baseline to beat (the opening
paragraph built on it is in :mod:`.headlines`).

Inputs are the evaluation pipeline's files (``evaluation_summary.csv``,
``evaluation_summary_by_domain.csv``, ``evaluation_results.parquet``,
``evaluation_run_info.json``) and the promotion pipeline's ``promotion_decision.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

# ``step_workers``: the evaluation's own reader of the ``workers`` column it writes, so the
# report counts workflow steps exactly as the summary's usage shares do
from conductor_pipeline.evaluation.config import CONDUCTOR_SYSTEMS
from conductor_pipeline.evaluation.metrics import step_workers
from conductor_pipeline.evaluation.registry import label_note
from conductor_pipeline.reporting.display import MissingInput, new_figure

PATTERNS = ("single", "chain", "independent", "tree")


def _need(path: str | Path | None, what: str) -> Path:
    if not path:
        raise MissingInput(f"{what[0].upper()}{what[1:]} is not available (no path was given)")
    path = Path(path)
    if not path.is_file():
        raise MissingInput(f"{what} not found at {path}")
    return path


def load_summary(path: str | Path | None) -> pd.DataFrame:
    return pd.read_csv(_need(path, "the evaluation summary"))


def load_by_domain(path: str | Path | None) -> pd.DataFrame:
    return pd.read_csv(_need(path, "the per-domain summary"))


def load_results(path: str | Path | None) -> pd.DataFrame:
    return pd.read_parquet(_need(path, "the per-question results"))


def load_json(path: str | Path | None, what: str) -> dict[str, Any]:
    return json.loads(_need(path, what).read_text(encoding="utf-8"))


def system_label(system: str) -> str:
    """The name reports show: simulated workers say so, and a kind's ``label_note`` is
    added (``handcrafted (told the domain)``)."""
    worker = system.split(":", 1)[1] if ":" in system else ""
    if worker.startswith("sim-"):
        return f"{system} (simulated worker)"
    note = label_note(system)
    return f"{system} ({note})" if note else system


def summary_table(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per system: accuracy with its interval, cost, tokens, calls, latency,
    failures, and the paired p-value against the Conductor where there is one."""

    def pct(value: Any) -> str:
        return "" if pd.isna(value) else f"{100 * float(value):.1f}"

    table = pd.DataFrame(
        {
            "system": summary["system"].map(system_label),
            "n": summary["n"],
            "accuracy %": summary["accuracy"].map(pct),
            "95% CI": [
                "" if pd.isna(lo) else f"[{pct(lo)}, {pct(hi)}]"
                for lo, hi in zip(summary["ci_low"], summary["ci_high"], strict=True)
            ],
            "cost $/q": summary["cost_usd_per_q"].map(lambda v: "" if pd.isna(v) else f"{v:.6f}"),
            "tokens/q": summary["tokens_per_q"].map(lambda v: "" if pd.isna(v) else f"{v:.0f}"),
            "calls/q": summary["calls_per_q"].map(lambda v: "" if pd.isna(v) else f"{v:.2f}"),
            "latency p50 s": summary["latency_p50_s"].map(
                lambda v: "" if pd.isna(v) else f"{v:.2f}"
            ),
            "infra failures": summary["infra_failures"],
        }
    )
    if "parse_failures" in summary:
        table["parse failures"] = summary["parse_failures"]
    if "p_value_vs_conductor" in summary:
        table["p vs conductor"] = summary["p_value_vs_conductor"].map(
            lambda v: "" if pd.isna(v) else f"{v:.3g}"
        )
    return table


def evaluated_models(run_info: dict[str, Any], summary: pd.DataFrame) -> str:
    """A sentence saying which Conductor was evaluated, and when it is the base policy."""
    lines = []
    label = run_info.get("conductor") or (
        summary.loc[summary["system"] == "conductor", "policy"].iloc[0]
        if "policy" in summary and (summary["system"] == "conductor").any()
        else None
    )
    if label:
        lines.append(f"**Conductor evaluated:** {label}")
    if run_info.get("conductor_variant"):
        lines.append(f"(`{run_info['conductor_variant']}`)")
    if run_info.get("conductor_is_base_policy"):
        lines.append(
            "\n\n**The evaluated Conductor is the untrained base policy**: no trained version "
            "was available to the evaluation."
        )
    if "simulated_pool" in summary and bool(summary["simulated_pool"].any()):
        lines.append(
            "\n\nWorkers named `sim-…` are **simulated** (sandbox profiles), not real models; "
            "costs are their declared list prices."
        )
    if not lines:
        raise MissingInput("the evaluation run info says nothing about the evaluated Conductor")
    return " ".join(lines)


def pareto_plot(summary: pd.DataFrame):
    from conductor_pipeline.evaluation.plots import pareto_figure

    return pareto_figure(summary)


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


# Benchmarks whose verdicts the code under test could forge, and why: a report prints this
# next to their figures (``code_sandbox``/``sandbox_harness`` explain the harness)
FORGEABLE_SOURCES = {
    "bigcodebench": (
        "BigCodeBench's figures: its unittest tests run inside the candidate's own process "
        "(they patch its modules and inspect its objects), so code written to attack the test "
        "harness can forge a pass. They are evaluation figures only; BigCodeBench is never a "
        "training reward."
    ),
}


def forgeable_verdicts_notes(
    results: pd.DataFrame | None, by_domain: pd.DataFrame | None = None
) -> list[str]:
    """One note per evaluated benchmark in :data:`FORGEABLE_SOURCES` (by the results'
    ``source`` column, or a per-source table's ``domain`` column); empty when none was."""
    present: set[str] = set()
    if results is not None and "source" in results.columns:
        present |= {str(s) for s in results["source"].dropna().unique()}
    if by_domain is not None and "domain" in by_domain.columns:
        present |= {str(s) for s in by_domain["domain"].dropna().unique()}
    return [text for source, text in FORGEABLE_SOURCES.items() if source in present]


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


def sim_label(name: Any) -> str:
    return f"{name} (sim)" if str(name).startswith("sim-") else str(name)


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
    columns = max(m.shape[1] for m in matrices)
    rows = max(m.shape[0] for m in matrices)
    figure = new_figure(max(6.0, (1.2 + 0.75 * columns) * len(shown)), max(2.8, 1.4 + 0.45 * rows))
    image = None
    for i, (system, matrix) in enumerate(zip(shown, matrices, strict=True)):
        ax = figure.add_subplot(1, len(shown), i + 1)
        matrix = matrix.rename(columns=sim_label)
        image = _draw_heatmap(ax, matrix)
        ax.axvline(matrix.shape[1] - 1.5, color="white", linewidth=3)  # workers | multi-step
        ax.set_title(system, fontsize=10)
        if i:
            ax.set_yticklabels([])
    figure.colorbar(image, ax=figure.axes, label="share of questions", shrink=0.9)
    figure.suptitle(
        "Who writes the answer (% of questions per domain), and how often the workflow has "
        "more than one step",
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
    shares.insert(0, "n", overall.groupby("system")["n"].first().loc[order])
    return shares.rename(columns={"multi_step": "multi-step"}).reset_index()


# --- how the Conductor plans, by domain and difficulty ---------------------------------------


def planning(results: pd.DataFrame) -> pd.DataFrame:
    """:func:`~conductor_pipeline.evaluation.routing.planning_by_difficulty` of the conductor
    and its warm start (:data:`ROUTING_SYSTEMS`; the warm start may be absent)."""
    from conductor_pipeline.evaluation.routing import planning_by_difficulty

    table = planning_by_difficulty(results, systems=ROUTING_SYSTEMS)
    if table.empty:
        raise MissingInput(f"no {' or '.join(ROUTING_SYSTEMS)} questions in the results")
    return table


def _system_name(system: str) -> str:
    return "the Conductor" if system == "conductor" else f"the {system.replace('-', ' ')}"


def planning_table(table: pd.DataFrame) -> pd.DataFrame:
    """The planning table as the report shows it: rows domain × difficulty (all domains
    last), for each system side by side its questions, multi-step %, mean steps, most common
    shape and answer worker (each with its share of the questions) and accuracy %."""
    from conductor_pipeline.evaluation.routing import ALL_DOMAINS, difficulty_order

    def pct(value: float) -> str:
        return f"{100 * value:.0f}"

    parts = []
    for system in dict.fromkeys(table["system"]):
        mine = table[table["system"] == system]
        part = pd.DataFrame(
            {
                "questions": mine["questions"].astype(int).to_numpy(),
                "multi-step %": mine["multi_step_share"].map(pct).to_numpy(),
                "mean steps": mine["mean_steps"]
                .map(lambda v: "—" if pd.isna(v) else f"{v:.2f}")
                .to_numpy(),
                "most common shape": [
                    f"{shape}, {pct(share)}%"
                    for shape, share in zip(mine["top_shape"], mine["top_shape_share"], strict=True)
                ],
                "answer worker": [
                    f"{sim_label(worker)}, {pct(share)}%"
                    for worker, share in zip(
                        mine["answer_worker"], mine["answer_worker_share"], strict=True
                    )
                ],
                "accuracy %": mine["accuracy"].map(pct).to_numpy(),
            },
            index=pd.MultiIndex.from_arrays(
                [mine["domain"], mine["difficulty"]], names=["domain", "difficulty"]
            ),
        )
        part.columns = pd.MultiIndex.from_product([[system_label(system)], part.columns])
        parts.append(part)
    shown = pd.concat(parts, axis=1)
    domains = list(dict.fromkeys(table["domain"]))
    domains = [*sorted(d for d in domains if d != ALL_DOMAINS), ALL_DOMAINS]
    levels = difficulty_order(table["difficulty"].unique())
    order = [(d, lv) for d in domains for lv in levels if (d, lv) in shown.index]
    return shown.loc[order].fillna("")


def _compared_levels(table: pd.DataFrame) -> list[str]:
    """The easiest and the hardest difficulty of the table (only the known levels)."""
    from conductor_pipeline.evaluation.routing import DIFFICULTIES

    present = set(table["difficulty"])
    known = [d for d in DIFFICULTIES if d in present]
    return [known[0], known[-1]] if len(known) > 1 else known


def steps_by_difficulty_sentence(table: pd.DataFrame) -> str:
    """Whether the Conductor spends more steps on hard questions, in one sentence computed
    from the planning table's rows over all domains, e.g. "The Conductor uses 2.8 steps on
    hard questions and 2.1 on easy ones; the warm start 2.0 and 2.0." Mean steps are
    compared as shown, to one decimal."""
    from conductor_pipeline.evaluation.routing import ALL_DOMAINS

    overall = table[table["domain"] == ALL_DOMAINS]
    levels = _compared_levels(overall)
    systems = list(dict.fromkeys(overall["system"]))
    if not systems or not levels:
        raise MissingInput("no easy, medium or hard questions to compare the steps of")

    def steps(system: str, level: str) -> float:
        row = overall[(overall["system"] == system) & (overall["difficulty"] == level)]
        return float(row["mean_steps"].iloc[0]) if len(row) else math.nan

    def text(value: float) -> str:
        return "—" if math.isnan(value) else f"{value:.1f}"

    first, rest = systems[0], systems[1:]
    if len(levels) == 1:
        (level,) = levels
        others = "".join(f"; {_system_name(s)} {text(steps(s, level))}" for s in rest)
        return (
            f"**Does it spend more steps on hard questions?** This evaluation cannot tell: "
            f"every test question is {level}. {_system_name(first).capitalize()} uses "
            f"{text(steps(first, level))} steps per workflow{others}."
        )
    easy, hard = levels
    on_hard, on_easy = steps(first, hard), steps(first, easy)
    if math.isnan(on_hard) or math.isnan(on_easy):
        answer = f"Cannot tell ({_system_name(first)} wrote no workflow for some of them)"
    elif round(on_hard, 1) > round(on_easy, 1):
        answer = "Yes"
    elif round(on_hard, 1) < round(on_easy, 1):
        answer = "No, fewer"
    else:
        answer = "No"
    sentence = (
        f"**Does it spend more steps on {hard} questions?** {answer}: "
        f"{_system_name(first)} uses {text(on_hard)} steps on {hard} questions and "
        f"{text(on_easy)} on {easy} ones"
    )
    for system in rest:
        sentence += f"; {_system_name(system)} {text(steps(system, hard))} and " + text(
            steps(system, easy)
        )
    return sentence + "."


def steps_by_difficulty_figure(table: pd.DataFrame):
    """Mean workflow steps per domain (groups of bars, all domains last) and difficulty
    (one bar each), one panel per system on a shared axis."""
    from conductor_pipeline.evaluation.routing import ALL_DOMAINS, difficulty_order

    systems = list(dict.fromkeys(table["system"]))
    domains = sorted(d for d in set(table["domain"]) if d != ALL_DOMAINS) + [ALL_DOMAINS]
    levels = difficulty_order(table["difficulty"].unique())
    width = 0.8 / len(levels)
    top = table["mean_steps"].max()
    top = 2.0 if pd.isna(top) else max(2.0, 1.15 * float(top))
    figure = new_figure(max(6.0, (1.0 + 0.7 * len(domains)) * len(systems)), 3.4)
    from matplotlib import colormaps

    cmap = colormaps["Blues"]  # easy light, hard dark
    for i, system in enumerate(systems):
        ax = figure.add_subplot(1, len(systems), i + 1)
        mine = table[table["system"] == system].set_index(["domain", "difficulty"])
        for j, level in enumerate(levels):
            values = [
                float(mine.loc[(d, level), "mean_steps"]) if (d, level) in mine.index else math.nan
                for d in domains
            ]
            ax.bar(
                [k + (j - (len(levels) - 1) / 2) * width for k in range(len(domains))],
                values,
                width=width,
                label=level,
                color=cmap(0.35 + 0.55 * j / max(len(levels) - 1, 1)),
            )
        ax.set_xticks(range(len(domains)))
        ax.set_xticklabels(domains, rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, top)
        ax.set_title(system_label(system), fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        if i == 0:
            ax.set_ylabel("mean steps per workflow")
        else:
            ax.set_yticklabels([])
    figure.axes[-1].legend(
        title="difficulty", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0)
    )
    figure.suptitle(
        "Does it spend more steps on hard questions? Mean workflow steps by domain and difficulty",
        fontsize=10,
    )
    figure.tight_layout()
    return figure


def planning_section(results: pd.DataFrame) -> list[Any]:
    """The section "How the Conductor plans, by domain and difficulty": the sentence on steps
    by difficulty, the figure, then the table (:func:`planning_table`)."""
    table = planning(results)
    parts: list[Any] = [steps_by_difficulty_sentence(table)]
    if "warm-start" not in set(table["system"]):
        parts.append("*This evaluation has no warm-start rows: the conductor is shown alone.*")
    parts += [steps_by_difficulty_figure(table), planning_table(table)]
    parts.append(
        "*Per domain and difficulty: multi-step % and the shares of the most common shape "
        "and answer worker are of the questions answered (infrastructure failures left out, "
        "as in the summary); mean steps counts the workflows written, a question without one "
        "is not a 0-step workflow.*"
    )
    return parts


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
    return shares.loc[order, [*PATTERNS, *extra]]


def access_pattern_figure(results: pd.DataFrame):
    shares = access_patterns(results)
    figure = new_figure(8, 3.2)
    ax = figure.add_subplot(1, 1, 1)
    left = pd.Series(0.0, index=shares.index)
    for pattern in shares.columns:
        ax.barh(shares.index, shares[pattern], left=left, label=pattern)
        left += shares[pattern]
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of workflows")
    ax.set_title("Access patterns of the workflows (who sees which earlier steps)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    return figure


def _steps_table(detail: dict[str, Any]) -> pd.DataFrame:
    steps = detail.get("workflow") or []
    return pd.DataFrame(
        [
            {
                "step": s.get("index"),
                "worker": s.get("worker_name") or s.get("worker"),
                "sees": ", ".join(map(str, s.get("access") or [])) or "—",
                "subtask": str(s.get("subtask") or "")[:200],
                "response": str(s.get("response") or s.get("failure") or "")[:160],
                "cost $": round(float(s.get("cost_usd") or 0.0), 6),
            }
            for s in steps
        ]
    )


def example_workflows(
    results: pd.DataFrame, *, correct: bool, system: str = "conductor", n: int = 2, seed: int = 0
) -> list[Any]:
    """``n`` of the ``system``'s questions it got right (or wrong), each with its workflow
    as a table: worker, which steps it saw, its subtask and reply."""
    rows = results[(results["system"] == system) & (results["correct"].astype(bool) == correct)]
    if rows.empty:
        raise MissingInput(f"no question the {system} answered {'right' if correct else 'wrong'}")
    # one per domain first, so the examples are varied
    picked = rows.sample(frac=1.0, random_state=seed).drop_duplicates("domain").head(n)
    if len(picked) < n:
        rest = rows.drop(picked.index).sample(frac=1.0, random_state=seed)
        picked = pd.concat([picked, rest.head(n - len(picked))])
    parts: list[Any] = []
    for row in picked.to_dict(orient="records"):
        try:
            detail = json.loads(row.get("detail") or "{}")
        except ValueError:
            detail = {}
        question = str(detail.get("question") or "")[:400].replace("\n", " ")
        parts.append(
            f"**{row['question_id']}** ({row['domain']}, {row['difficulty']}) — "
            f"answer `{str(row.get('extracted') or row.get('answer') or '')[:80]}`, "
            f"{row.get('verdict') or ('correct' if correct else 'wrong')}; "
            f"{_steps_text(row.get('n_steps'))}, ${float(row.get('cost_usd') or 0):.6f}"
            + (f"\n\n> {question}" if question else "")
        )
        if row.get("parse_failure"):
            parts.append("*The Conductor wrote no parseable workflow for this question.*")
            continue
        table = _steps_table(detail)
        if len(table):
            parts.append(table)
    return parts


def as_count(value: Any) -> int:
    """A count that may arrive as a float or NaN (a missing workflow has no steps)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0
    return int(number) if math.isfinite(number) else 0


def _steps_text(value: Any) -> str:
    steps = as_count(value)
    return f"{steps} step" + ("" if steps == 1 else "s")


# the figures of the promotion table, each with how it is written (a count stays an int)
_FIGURE_FORMATS = {
    "accuracy": "{:.3f}",
    "cost_usd_per_q": "{:.6f}",
    "parse_rate": "{:.3f}",
    "n": "{:.0f}",
}


def _figure_text(key: str, value: Any) -> str:
    if not isinstance(value, int | float) or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return _FIGURE_FORMATS[key].format(value)


def _figures_row(figures: dict[str, Any] | None) -> dict[str, Any]:
    figures = figures or {}
    return {k: figures.get(k) for k in _FIGURE_FORMATS}


def promotion_summary(decision: dict[str, Any]) -> list[Any]:
    """The decision on the challenger, its reasons, and the figures side by side."""
    verdict = decision.get("decision", "unknown")
    version = decision.get("version")
    previous = decision.get("previous_champion")
    now = decision.get("champion")
    before_text = f"`conductor/{previous}`" if previous else "none"
    now_text = f"`conductor/{now}`" if now else "none"
    parts: list[Any] = [
        f"**Challenger:** `conductor/{version}` — decision: **{verdict}**. "
        f"Champion before: {before_text}; champion now: {now_text}."
    ]
    reasons = decision.get("reasons") or []
    if reasons:
        parts.append("\n".join(f"- {r}" for r in reasons))
    figures = decision.get("figures") or {}
    challenger, champion = figures.get("challenger"), figures.get("champion")
    if challenger or champion:
        table = pd.DataFrame(
            {
                "challenger": _figures_row(challenger),
                "champion": _figures_row(champion),
            }
        )
        if challenger and champion:
            table["difference"] = [
                (c - p) if isinstance(c, int | float) and isinstance(p, int | float) else None
                for c, p in zip(table["challenger"], table["champion"], strict=True)
            ]
        # written out per row: a float column would print the count n as 24.000000
        for column in table.columns:
            table[column] = [_figure_text(k, v) for k, v in table[column].items()]
        parts.append(table)
    if decision.get("champion_source"):
        parts.append(f"*Champion figures: {decision['champion_source']}.*")
    gates = decision.get("gates")
    if gates:
        parts.append("*Gates:* " + ", ".join(f"{k} = {v}" for k, v in gates.items()))
    return parts


def registry_versions(tracking_uri: str, name: str = "conductor", limit: int = 10) -> pd.DataFrame:
    """The latest registered versions with their aliases and promotion decisions."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        model = client.get_registered_model(name)
    except MlflowException as err:
        raise MissingInput(f"no registered model {name!r} in {tracking_uri}") from err
    aliases: dict[str, list[str]] = {}
    for alias, version in (model.aliases or {}).items():
        aliases.setdefault(str(version), []).append(alias)
    versions = client.search_model_versions(f"name='{name}'")
    rows = []
    for mv in sorted(versions, key=lambda v: int(v.version), reverse=True)[:limit]:
        tags = mv.tags or {}
        figures = {}
        for key in ("evaluation.figures", "promotion.figures"):
            try:
                data = json.loads(tags.get(key) or "{}")
            except ValueError:
                continue
            figures = data.get("challenger", data) if key == "promotion.figures" else data
            if figures:
                break
        rows.append(
            {
                "version": int(mv.version),
                "aliases": ", ".join(sorted(aliases.get(str(mv.version), []))),
                "decision": tags.get("promotion.decision", ""),
                "accuracy": figures.get("accuracy"),
                "cost $/q": figures.get("cost_usd_per_q"),
                "parse rate": figures.get("parse_rate"),
                "reason": str(tags.get("promotion.reason", ""))[:200],
            }
        )
    if not rows:
        raise MissingInput(f"registered model {name!r} has no versions")
    return pd.DataFrame(rows)


# systems that are not baselines to beat: the oracle reads the answer key (an upper bound),
# and the Conductor systems are the Conductor itself, its warm start and its base policy.
# ``handcrafted`` is one (a pipeline one could run; its label says it is told the domain)
NOT_BASELINES = frozenset({"oracle", *CONDUCTOR_SYSTEMS})


def best_baseline(summary: pd.DataFrame) -> pd.Series:
    """The baseline the Conductor has to beat: the most accurate system that is neither a
    Conductor variant nor the oracle; the cheaper one on a tie in accuracy."""
    rows = summary[~summary["system"].isin(NOT_BASELINES)].dropna(subset=["accuracy"])
    if rows.empty:
        raise MissingInput("the evaluation summary has no baseline to compare the Conductor with")
    cost = rows["cost_usd_per_q"].fillna(math.inf)
    order = rows.assign(_cost=cost).sort_values(["accuracy", "_cost"], ascending=[False, True])
    return order.iloc[0]
