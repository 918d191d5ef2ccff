"""How the Conductor plans, by domain and difficulty: whether it spends more steps on hard
questions (a sentence, a figure) and the planning table."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from conductor_pipeline.reporting.display import MissingInput, new_figure
from conductor_pipeline.reporting.evaluation_inputs import sim_label, system_label
from conductor_pipeline.reporting.evaluation_routing import ROUTING_SYSTEMS


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
