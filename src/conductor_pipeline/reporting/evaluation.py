"""The evaluation report's content. This module holds the summary table with confidence
intervals, the cost–accuracy plot, the warning for benchmarks whose verdicts the code under
test could forge (BigCodeBench), the best baseline to beat, and the list of sections built
from the per-question results; it re-exports the rest so the notebook reaches everything as
``ev.<name>``:

- :mod:`.evaluation_inputs`: reading the files, system and worker labels;
- :mod:`.evaluation_routing`: heat maps, who writes the answer, shapes, access patterns;
- :mod:`.evaluation_planning`: how the Conductor plans by domain and difficulty;
- :mod:`.examples`: sample workflows that succeeded and failed;
- :mod:`.evaluation_promotion`: the promotion decision and the registered versions.

Inputs are the evaluation pipeline's files (``evaluation_summary.csv``,
``evaluation_summary_by_domain.csv``, ``evaluation_results.parquet``,
``evaluation_run_info.json``) and the promotion pipeline's ``promotion_decision.json``; the
opening paragraph is written in :mod:`.headlines`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pandas as pd

from conductor_pipeline.evaluation.config import CONDUCTOR_SYSTEMS
from conductor_pipeline.reporting.display import MissingInput

# the parts of the report that live in their own modules, reached by the notebook as ev.<name>
from conductor_pipeline.reporting.evaluation_inputs import (  # noqa: F401  (re-exported)
    as_count,
    load_by_domain,
    load_json,
    load_results,
    load_summary,
    sim_label,
    system_label,
)
from conductor_pipeline.reporting.evaluation_planning import (  # noqa: F401  (re-exported)
    planning,
    planning_section,
    planning_table,
    steps_by_difficulty_figure,
    steps_by_difficulty_sentence,
)
from conductor_pipeline.reporting.evaluation_promotion import (  # noqa: F401  (re-exported)
    promotion_summary,
    registry_versions,
)
from conductor_pipeline.reporting.evaluation_routing import (  # noqa: F401  (re-exported)
    PATTERNS,
    ROUTING_SYSTEMS,
    SINGLE_STEP_REDUNDANT,
    access_pattern_figure,
    access_patterns,
    answer_routing,
    domain_accuracy,
    domain_accuracy_figure,
    heatmap_figure,
    routing,
    routing_figure,
    shape_shares,
    single_step_everywhere,
    worker_choice,
    worker_choice_figure,
    workflow_structure,
)
from conductor_pipeline.reporting.examples import example_workflows  # noqa: F401


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


Section = tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def results_sections(results: pd.DataFrame, examples_per_kind: int = 2) -> list[Section]:
    """The sections built from the per-question results, in report order, as ``(title,
    build, args, kwargs)`` for :func:`~conductor_pipeline.reporting.display.section`.

    When every workflow is single-step that fact is one section (:func:`workflow_structure`)
    and the panels that would only repeat it (:data:`SINGLE_STEP_REDUNDANT`) are left out."""
    single = single_step_everywhere(results)
    sections: list[Section] = []
    if single:
        sections.append(("Workflow structure", workflow_structure, (results,), {}))
    sections += [
        ("Worker choice by domain", worker_choice_figure, (results,), {}),
        ("Answer routing: conductor and warm start", routing_figure, (results,), {}),
        ("Workflow shapes (% of questions)", shape_shares, (results,), {}),
        ("How the Conductor plans, by domain and difficulty", planning_section, (results,), {}),
        ("Access patterns", access_pattern_figure, (results,), {}),
    ]
    if single:
        sections = [part for part in sections if part[0] not in SINGLE_STEP_REDUNDANT]
    for title, correct in (("Workflows that succeeded", True), ("Workflows that failed", False)):
        sections.append((title, example_workflows, (results,), {"correct": correct,
                                                                 "n": examples_per_kind}))  # fmt: skip
    return sections
