"""The computed opening paragraphs of both reports: who won the evaluation and by how much
(with the paired bootstrap interval and the McNemar p), and what GRPO changed over
training. Each reads the tables the report's other sections read, through
:mod:`.evaluation` and :mod:`.training`, and writes Markdown for
:func:`~conductor_pipeline.reporting.display.headline`.

They live apart from the figure and table code because they draw on both reports' helpers
and hold the statistics the figures do not need.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from conductor_pipeline.evaluation.config import CONDUCTOR_SYSTEMS
from conductor_pipeline.reporting.display import MissingInput
from conductor_pipeline.reporting.evaluation import (
    as_count,
    best_baseline,
    routing,
    sim_label,
    system_label,
)
from conductor_pipeline.reporting.training import sft_loss, stage_series, worker_label, worker_usage

# --- the evaluation report ---------------------------------------------------------------

SIGNIFICANCE = 0.05


def _reference(summary: pd.DataFrame) -> str:
    systems = list(summary["system"])
    for name in ("conductor", *CONDUCTOR_SYSTEMS):
        if name in systems:
            return name
    raise MissingInput("the evaluation summary has no Conductor row")


def _p_text(p: float) -> str:
    """A p-value as people read it: two decimals, or scientific when tiny."""
    return f"{p:.2f}" if p >= 0.01 else f"{p:.1e}"


def paired_difference_ci(
    results: pd.DataFrame,
    system: str,
    other: str,
    *,
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, int]:
    """Percentile bootstrap interval of accuracy(system) − accuracy(other) over the
    questions both answered (resampling questions, so the pairing is kept), and how many
    questions that is."""
    # kept on numpy rather than scipy.stats.bootstrap: a mean of resampled differences is two
    # lines, and these seeded draws are the interval the reports have always printed
    import numpy as np

    def correct(name: str) -> pd.Series:
        rows = results[results["system"] == name]
        return rows.groupby("question_id")["correct"].first().astype(bool)

    mine, theirs = correct(system), correct(other)
    shared = mine.index.intersection(theirs.index)
    if not len(shared):
        raise MissingInput(f"no question answered by both {system} and {other}")
    diff = mine.loc[shared].to_numpy(dtype=float) - theirs.loc[shared].to_numpy(dtype=float)
    rng = np.random.default_rng(seed)
    means = rng.choice(diff, size=(samples, diff.size), replace=True).mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(low), float(high), int(diff.size)


def _points(value: float) -> str:
    return f"{100 * value:+.1f}".replace("-", "−")


def _what_it_learned(routing_table: pd.DataFrame, system: str) -> str | None:
    """A sentence on the Conductor's routing: the worker that writes the answer per domain
    (grouped when one worker takes several), and the share of multi-step workflows."""
    from conductor_pipeline.evaluation.routing import ALL_DOMAINS, MULTI_STEP, NO_WORKFLOW

    mine = routing_table[routing_table["system"] == system]
    workers = mine[(mine["kind"] == "worker") & (mine["value"] != NO_WORKFLOW)]
    workers = workers[workers["domain"] != ALL_DOMAINS]
    if workers.empty:
        return None
    top = workers.sort_values("share", ascending=False).drop_duplicates("domain")
    by_worker: dict[str, list[str]] = {}
    for row in top.sort_values("domain").to_dict(orient="records"):
        by_worker.setdefault(str(row["value"]), []).append(
            f"{row['domain']} {100 * float(row['share']):.0f}%"
        )
    parts = [
        f"to {sim_label(worker)} in {', '.join(domains)}"
        for worker, domains in sorted(by_worker.items(), key=lambda kv: -len(kv[1]))
    ]
    sentence = (
        "**What the Conductor learned:** per domain, the answer step goes most often "
        + "; ".join(parts)
        + " (share of that domain's questions)"
    )
    multi = mine[
        (mine["kind"] == "workflow")
        & (mine["value"] == MULTI_STEP)
        & (mine["domain"] == ALL_DOMAINS)
    ]
    if len(multi):
        sentence += (
            f"; {100 * float(multi['share'].iloc[0]):.0f}% of its workflows have more than one step"
        )
    return sentence + "."


def evaluation_headline(
    summary: pd.DataFrame,
    results: pd.DataFrame | None = None,
    routing_table: pd.DataFrame | None = None,
) -> str:
    """The report's opening paragraph (Markdown): who won, the Conductor against the best
    baseline with the accuracy margin, its 95 % paired bootstrap interval (from the
    per-question ``results``) and the exact McNemar p (the summary's
    ``p_value_vs_conductor``), the cost ratio, the oracle's ceiling, and what the Conductor
    learned (from the routing table, ``evaluation_routing.csv``)."""
    reference = _reference(summary)
    mine = summary[summary["system"] == reference].iloc[0]
    base = best_baseline(summary)
    name = system_label(str(base["system"]))
    n = as_count(mine.get("n"))
    acc, base_acc = float(mine["accuracy"]), float(base["accuracy"])
    margin = acc - base_acc
    p = base.get("p_value_vs_conductor")
    p = float(p) if isinstance(p, int | float) and not math.isnan(float(p)) else None
    significant = p is not None and p < SIGNIFICANCE
    me = "the Conductor" if reference == "conductor" else f"the {reference}"
    subject = me[0].upper() + me[1:]
    if abs(margin) < 1e-12:
        text = (
            f"**No winner:** {me} and the best baseline, {name}, both answer "
            f"{100 * acc:.1f}% of {n} test questions"
        )
    elif margin > 0:
        text = (
            f"**Winner: {me}** — {100 * acc:.1f}% of {n} test questions against "
            f"{100 * base_acc:.1f}% for the best baseline, {name}; "
            f"{100 * margin:.1f} points ahead"
        )
    else:
        text = (
            f"**Winner: {name}** (the best baseline) — {100 * base_acc:.1f}% of {n} test "
            f"questions against {100 * acc:.1f}% for {me}; {me} is "
            f"{100 * -margin:.1f} points behind"
        )
    stats = []
    if results is not None:
        try:
            low, high, _ = paired_difference_ci(results, reference, str(base["system"]))
        except MissingInput:
            pass
        else:
            stats.append(
                f"95% paired bootstrap CI of {me} − {name}: {_points(low)} to {_points(high)} points"
            )
    if p is not None:
        stats.append(f"exact McNemar p = {_p_text(p)}")
    if stats:
        text += f" ({'; '.join(stats)})"
    text += "."
    if margin and p is not None and not significant:
        text += (
            f" The difference is not significant at the 5% level: this evaluation cannot "
            f"tell {me} and {name} apart."
        )
    elif margin and significant:
        text += " The difference is significant at the 5% level."
    cost, base_cost = float(mine["cost_usd_per_q"]), float(base["cost_usd_per_q"])
    if base_cost > 0 and math.isfinite(cost):
        text += (
            f" {subject} spends {cost / base_cost:.1f}× the worker cost per question of "
            f"{name} (${cost:.6f} against ${base_cost:.6f})."
        )
    elif math.isfinite(cost):
        text += f" {subject} spends ${cost:.6f} per question; {name} costs nothing."
    oracle = summary[summary["system"] == "oracle"]
    if len(oracle) and pd.notna(oracle["accuracy"].iloc[0]):
        text += (
            f" The oracle (a correct worker whenever one exists, read from the answer key) "
            f"reaches {100 * float(oracle['accuracy'].iloc[0]):.1f}%."
        )
    learned = None
    # the routing table needs the full per-question results (workflow details, split)
    if routing_table is None and results is not None and {"detail", "split"} <= set(results):
        try:
            routing_table = routing(results)
        except MissingInput:
            routing_table = None
    if routing_table is not None:
        learned = _what_it_learned(routing_table, reference)
    return text + (f"\n\n{learned}" if learned else "")


# --- the training report -----------------------------------------------------------------


def _first_last(history: pd.DataFrame, metric: str) -> tuple[str, float, float, int, int] | None:
    """``(stage, first, last, first step, last step)`` of the first stage that logged
    ``<stage>/<metric>``."""
    for stage, part in stage_series(history, metric).items():
        return (
            stage,
            float(part["value"].iloc[0]),
            float(part["value"].iloc[-1]),
            int(part["step"].iloc[0]),
            int(part["step"].iloc[-1]),
        )
    return None


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def training_headline(history: pd.DataFrame, adapter_info: dict[str, Any] | None = None) -> str:
    """One paragraph (Markdown) on what GRPO changed between its first and last logged
    step: mean reward, parse rate, and the workers whose share of workflow steps moved
    most; plus the warm start's loss when it was logged per step."""
    reward = _first_last(history, "reward/mean")
    if reward is None:
        raise MissingInput("the training history has no '<stage>/reward/mean' metric")
    stage, first, last, step0, step1 = reward
    name = "GRPO" if stage == "grpo" else stage
    steps = step1 - step0 + 1
    direction = "rose" if last > first + 1e-9 else "fell" if last < first - 1e-9 else "stayed"
    sentences = [
        f"**What {name} changed** over {steps} logged step{'s' if steps != 1 else ''} "
        f"({step0} → {step1}): the mean reward {direction} "
        + (f"at {last:.2f}" if direction == "stayed" else f"from {first:.2f} to {last:.2f}")
    ]
    parse = _first_last(history, "rollouts/parse_rate")
    if parse is not None:
        sentences[-1] += (
            f", and the share of rollouts that parse as a workflow went from "
            f"{_pct(parse[1])} to {_pct(parse[2])}"
        )
    sentences[-1] += "."
    try:
        usage = worker_usage(history)
    except MissingInput:
        usage = None
    if usage is not None and len(usage):
        start, end = usage.iloc[0].drop("step"), usage.iloc[-1].drop("step")
        moved = (end - start).abs().sort_values(ascending=False)
        shown = [w for w in moved.index if moved[w] >= 0.05][:4] or [end.idxmax()]
        changes = ", ".join(f"{worker_label(w)} {_pct(start[w])} → {_pct(end[w])}" for w in shown)
        top = end.idxmax()
        sentences.append(
            f"Share of workflow steps per worker, first → last step: {changes}; at the last "
            f"step the Conductor calls {worker_label(top)} most ({_pct(end[top])})."
        )
    sft = (adapter_info or {}).get("sft") or {}
    try:
        loss, _ = sft_loss(history, adapter_info)
    except MissingInput:
        loss = None
    if loss is not None and len(loss) > 1:
        sentences.append(
            f"The warm start (SFT) took the loss from {loss['loss'].iloc[0]:.3f} to "
            f"{loss['loss'].iloc[-1]:.3f} in {int(loss['step'].iloc[-1])} steps."
        )
    elif isinstance(sft, dict) and isinstance(sft.get("final_loss"), int | float):
        sentences.append(
            f"The warm start (SFT, {sft.get('steps')} steps) ended at loss "
            f"{float(sft['final_loss']):.3f}."
        )
    return " ".join(sentences)
