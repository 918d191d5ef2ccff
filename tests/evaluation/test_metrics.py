"""Metrics on a hand-made results table: accuracy, bootstrap bounds, costs, failures, McNemar."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from conductor_pipeline.evaluation import (
    CONTRACT_COLUMNS,
    QuestionResult,
    bootstrap_ci,
    mcnemar_exact,
    mlflow_metrics,
    pareto_front,
    results_frame,
    summarise,
    summarise_by_domain,
)


def row(system, q, correct, *, cost=0.01, tokens=100, calls=1, latency=1.0, **extra):
    return QuestionResult(
        system=system,
        variant="v",
        question_id=f"q{q}",
        split="test",
        domain="math" if q % 2 == 0 else "logic",
        difficulty="easy",
        correct=correct,
        cost_usd=cost,
        tokens=tokens,
        calls=calls,
        latency_s=latency,
        **extra,
    )


@pytest.fixture
def table() -> pd.DataFrame:
    rows = []
    # conductor: 8/10 right, q9 a parse failure, q8 touched by an infrastructure failure
    for q in range(10):
        rows.append(
            row(
                "conductor",
                q,
                q < 8,
                cost=0.02,
                tokens=300,
                calls=2,
                latency=float(q + 1),
                parse_failure=q == 9,
                infra_failure=q == 8,
                failed_calls=1 if q == 8 else 0,
                n_steps=None if q == 9 else 2,
                access_pattern=None if q == 9 else ("chain" if q < 6 else "independent"),
                workers=["sim-a", "real-b"] if q != 9 else [],
                policy="scripted v1",
            )
        )
    # a solo worker: right on q0-q2 only, cheaper
    for q in range(10):
        rows.append(row("solo:sim-a", q, q < 3, cost=0.001, tokens=50, workers=["sim-a"]))
    return results_frame(rows)


def test_contract_columns_first_and_known_values(table):
    summary = summarise(table, samples=1000, seed=1)
    assert list(summary.columns[: len(CONTRACT_COLUMNS)]) == CONTRACT_COLUMNS
    assert summary["system"].tolist() == ["conductor", "solo:sim-a"]
    c = summary.set_index("system").loc["conductor"]
    # q8 (infra-failed) has no answer to judge: out of n and accuracy, counted apart;
    # q9 (parse failure) is the Conductor's own doing: in n, wrong
    assert c["n"] == 9
    assert c["accuracy"] == pytest.approx(8 / 9)
    assert c["cost_usd_per_q"] == pytest.approx(0.02)
    assert c["tokens_per_q"] == pytest.approx(300)
    assert c["calls_per_q"] == pytest.approx(2)
    assert c["latency_p50_s"] == pytest.approx(5.0)  # latencies 1..8 and 10
    assert c["latency_p95_s"] == pytest.approx(9.2)
    assert c["infra_failures"] == 1
    assert c["failed_calls"] == 1  # the failed call of the excluded row still counts
    assert c["parse_failures"] == 1
    assert c["steps_per_workflow"] == pytest.approx(2)
    assert c["pattern_chain"] == pytest.approx(6 / 8)
    assert c["pattern_independent"] == pytest.approx(2 / 8)
    assert c["usage_sim-a"] == pytest.approx(0.5)
    assert c["simulated_call_share"] == pytest.approx(0.5)
    assert c["policy"] == "scripted v1"
    assert bool(c["simulated_pool"])
    assert math.isnan(c["p_value_vs_conductor"])
    # CI bounds: inside [0, 1], around the estimate, width of a 9-question interval
    assert 0.5 <= c["ci_low"] <= 0.8 < 8 / 9 < 0.95 <= c["ci_high"] <= 1.0
    s = summary.set_index("system").loc["solo:sim-a"]
    assert s["n"] == 10 and s["infra_failures"] == 0
    assert s["accuracy"] == pytest.approx(0.3)
    # paired on the 9 questions the conductor has an answer for: conductor-only right on
    # q3..q7 (5), solo-only right on none
    assert s["p_value_vs_conductor"] == pytest.approx(2 * (1 / 2**5))
    assert s["accuracy_delta_vs_conductor"] == pytest.approx(3 / 9 - 8 / 9)


def test_an_infra_failed_row_is_left_out_even_when_its_answer_was_right(table):
    """A right answer reached despite a failed call is not counted either: with the call
    it might have been another answer, and the rule must not depend on luck."""
    flipped = table.copy()
    flipped.loc[
        (flipped["system"] == "conductor") & (flipped["question_id"] == "q8"), "correct"
    ] = True
    before = summarise(table, samples=200).set_index("system").loc["conductor"]
    after = summarise(flipped, samples=200).set_index("system").loc["conductor"]
    assert after["accuracy"] == before["accuracy"] and after["n"] == before["n"] == 9


def test_a_system_whose_every_row_failed_has_no_accuracy(table):
    dead = table.copy()
    dead.loc[dead["system"] == "solo:sim-a", "infra_failure"] = True
    s = summarise(dead, samples=200).set_index("system").loc["solo:sim-a"]
    assert s["n"] == 0 and s["infra_failures"] == 10
    assert math.isnan(s["accuracy"]) and math.isnan(s["cost_usd_per_q"])


def test_bootstrap_is_seeded_and_sensible():
    outcomes = [True] * 70 + [False] * 30
    first = bootstrap_ci(outcomes, samples=2000, seed=7)
    assert first == bootstrap_ci(outcomes, samples=2000, seed=7)
    low, high = first
    # the normal approximation gives 0.61 .. 0.79
    assert 0.58 <= low <= 0.64 and 0.76 <= high <= 0.82
    assert bootstrap_ci([True] * 5, seed=0) == (1.0, 1.0)
    assert all(math.isnan(v) for v in bootstrap_ci([], seed=0))


def test_bootstrap_agrees_with_scipys_percentile_bootstrap():
    # the same method as scipy.stats.bootstrap(method="percentile"); only the draws differ
    from scipy.stats import bootstrap

    outcomes = [True] * 130 + [False] * 70
    ours = bootstrap_ci(outcomes, samples=4000, seed=3)
    theirs = bootstrap(
        ([float(v) for v in outcomes],),
        lambda x, axis: x.mean(axis=axis),
        n_resamples=4000,
        method="percentile",
        rng=3,
    ).confidence_interval
    assert ours == pytest.approx((theirs.low, theirs.high), abs=0.015)
    # a group of one question: scipy refuses it, the reports need an interval all the same
    assert bootstrap_ci([True], seed=0) == (1.0, 1.0)
    with pytest.raises(ValueError):
        bootstrap(([1.0],), lambda x, axis: x.mean(axis=axis), method="percentile")


def test_mcnemar_is_the_hand_computed_exact_binomial_p():
    for only_a in range(26):
        for only_b in range(26 - only_a):
            n = only_a + only_b
            tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n
            expected = min(1.0, 2.0 * tail) if n else 1.0
            a = [True] * only_a + [False] * only_b + [True, False]
            b = [False] * only_a + [True] * only_b + [True, False]
            assert mcnemar_exact(a, b) == pytest.approx(expected, rel=1e-12), (only_a, only_b)


def test_mcnemar_exact_on_known_tables():
    # 10 pairs only A got right, 2 only B: p = 2 * P(X <= 2 | n=12, 1/2) = 158 / 4096
    a = [True] * 10 + [False] * 2 + [True] * 5 + [False] * 3
    b = [False] * 10 + [True] * 2 + [True] * 5 + [False] * 3
    assert mcnemar_exact(a, b) == pytest.approx(158 / 4096)
    assert mcnemar_exact(b, a) == pytest.approx(158 / 4096)
    assert mcnemar_exact([True, False], [True, False]) == 1.0
    assert mcnemar_exact([True] * 3 + [False] * 3, [False] * 3 + [True] * 3) == 1.0
    with pytest.raises(ValueError):
        mcnemar_exact([True], [True, False])


def test_per_domain_summary_and_metrics_and_front(table):
    by_domain = summarise_by_domain(table, samples=500)
    assert set(by_domain["domain"]) == {"math", "logic"}
    # the infra-failed q8 is left out per domain as overall
    assert by_domain.groupby("system")["n"].sum().to_dict() == {"conductor": 9, "solo:sim-a": 10}
    assert by_domain.groupby("system")["infra_failures"].sum().to_dict() == {
        "conductor": 1,
        "solo:sim-a": 0,
    }
    summary = summarise(table, samples=500)
    metrics = mlflow_metrics(summary)
    assert metrics["conductor.accuracy"] == {"value": pytest.approx(8 / 9), "step": 0}
    assert "solo:sim-a.p_value_vs_conductor" in metrics
    assert metrics["conductor.n"]["value"] == 9
    assert metrics["conductor.infra_failures"]["value"] == 1
    plus = summary.assign(system=["conductor+recursion", "solo:sim-a"])
    assert "conductor_recursion.accuracy" in mlflow_metrics(plus)
    # cheaper-and-worse and dearer-and-better are both on the front; the oracle never is
    front_table = pd.DataFrame(
        {
            "system": ["a", "b", "c", "oracle"],
            "accuracy": [0.3, 0.8, 0.5, 1.0],
            "cost_usd_per_q": [0.001, 0.02, 0.05, 0.001],
        }
    )
    assert pareto_front(front_table) == ["a", "b"]
