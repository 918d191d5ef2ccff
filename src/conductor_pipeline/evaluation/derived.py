"""The results derived without calls: per domain the best solo worker on the validation
questions (the router's choice, and the solvers ``handcrafted`` picks from), the router's
and the oracle's rows from the solo rows. Their kinds are in
:mod:`~conductor_pipeline.evaluation.kinds`."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from conductor_pipeline.evaluation.records import QuestionResult
from conductor_pipeline.evaluation.systems import fingerprint
from conductor_pipeline.tasks import Task


def mean_of(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.fmean(values) if values else None


def scored(rows: Iterable[QuestionResult]) -> list[QuestionResult]:
    """The rows that count: infra-failed ones are neither right nor wrong."""
    return [r for r in rows if not r.infra_failure]


def route_by_domain(
    validation_results: Mapping[str, list[QuestionResult]],
    candidates: Sequence[str],
    domains: Iterable[str],
) -> dict[str, str]:
    """Per domain, the candidate with the best validation accuracy in that domain (ties:
    the cheaper; a domain absent from validation: the best overall). Infra-failed validation
    answers say nothing about a worker and are left out."""

    def rank(rows: list[QuestionResult]) -> tuple[float, float]:
        return (
            mean_of(r.correct for r in rows) or 0.0,
            -(mean_of(r.cost_usd for r in rows) or 0.0),
        )

    overall = {w: scored(validation_results.get(f"solo:{w}", [])) for w in candidates}
    default = max(candidates, key=lambda w: rank(overall[w]))
    choice: dict[str, str] = {}
    for domain in sorted(set(domains)):
        rows = {w: [r for r in overall[w] if r.domain == domain] for w in candidates}
        if any(rows.values()):
            choice[domain] = max(candidates, key=lambda w: rank(rows[w]))
        else:
            choice[domain] = default
    return choice


def derive_router(
    results: dict[str, list[QuestionResult]],
    validation_results: dict[str, list[QuestionResult]],
    candidates: Sequence[str],
    test_tasks: Sequence[Task],
    pool_id: str,
    info: dict[str, Any],
) -> list[QuestionResult]:
    """One worker per domain (:func:`route_by_domain`); each test answer is that worker's
    solo answer."""
    choice = route_by_domain(validation_results, candidates, (t.domain for t in test_tasks))
    info["router"] = choice
    variant = fingerprint("router", pool_id, choice)
    by_system = {name: {r.question_id: r for r in rows} for name, rows in results.items()}
    routed = []
    for task in test_tasks:
        worker = choice[task.domain]
        source = by_system[f"solo:{worker}"][task.id]
        row = replace(source, system="router", variant=variant, note=f"routed to {worker}")
        row.detail = {"routed_to": worker, **source.detail}
        routed.append(row)
    return routed


def derive_oracle(
    solo_results: Sequence[list[QuestionResult]], pool_id: str
) -> list[QuestionResult]:
    """Per question: right if any solo worker was right; charged like the cheapest right
    worker (the cheapest worker when none was right). Infra-failed when any solo row of the
    question is: the missing answer could have changed the cost charged, or the verdict."""
    by_question: dict[str, list[QuestionResult]] = defaultdict(list)
    order: list[str] = []
    for rows in solo_results:
        for r in rows:
            if r.question_id not in by_question:
                order.append(r.question_id)
            by_question[r.question_id].append(r)
    variant = fingerprint(
        "oracle", pool_id, sorted({r.system for rows in solo_results for r in rows})
    )
    out = []
    for qid in order:
        rows = by_question[qid]
        right = [r for r in rows if r.correct]
        chosen = min(right or rows, key=lambda r: r.cost_usd)
        row = replace(
            chosen,
            system="oracle",
            variant=variant,
            correct=bool(right),
            infra_failure=any(r.infra_failure for r in rows),
            note=f"charged as {chosen.system}",
        )
        row.detail = {"right": [r.system for r in right], "charged_as": chosen.system}
        out.append(row)
    return out
