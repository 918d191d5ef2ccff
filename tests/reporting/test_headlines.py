"""The reports' opening paragraphs and the helpers behind the report fixes of issue 14, on
small hand-made tables: who won (the Conductor winning, losing, tying), the margin with its
paired interval and the McNemar p, the cost ratio, what the Conductor learned, what GRPO
changed, the SFT loss source, where the rollout samples are, the clipped reward band and
counts written as integers."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from conductor_pipeline.reporting import MissingInput
from conductor_pipeline.reporting import evaluation as ev
from conductor_pipeline.reporting import headlines as hl
from conductor_pipeline.reporting import training as tr
from conductor_pipeline.reporting.display import tidy_table


def _summary(rows: list[tuple]) -> pd.DataFrame:
    """``(system, accuracy, cost, p_value_vs_conductor)`` rows as the evaluation summary."""
    return pd.DataFrame(
        [
            {
                "system": system,
                "n": 10,
                "accuracy": accuracy,
                "ci_low": max(accuracy - 0.1, 0.0),
                "ci_high": min(accuracy + 0.1, 1.0),
                "cost_usd_per_q": cost,
                "p_value_vs_conductor": p,
            }
            for system, accuracy, cost, p in rows
        ]
    )


def _results(correct: dict[str, list[bool]]) -> pd.DataFrame:
    """Per-question results: ``{system: [correct of question 0, 1, ...]}``."""
    return pd.DataFrame(
        [
            {"system": system, "question_id": f"q{i}", "correct": value}
            for system, values in correct.items()
            for i, value in enumerate(values)
        ]
    )


def _routing(shares: dict[str, dict[str, float]], multi_step: float) -> pd.DataFrame:
    """A routing table (``evaluation_routing.csv``) for the conductor."""
    rows = [
        {"system": "conductor", "domain": domain, "kind": "worker", "value": worker,
         "share": share, "count": round(10 * share), "n": 10}
        for domain, workers in shares.items()
        for worker, share in workers.items()
    ]  # fmt: skip
    rows.append(
        {"system": "conductor", "domain": "(all)", "kind": "workflow", "value": "multi_step",
         "share": multi_step, "count": round(10 * multi_step), "n": 10}
    )  # fmt: skip
    return pd.DataFrame(rows)


def test_evaluation_headline_when_the_conductor_wins():
    summary = _summary(
        [
            ("conductor", 0.9, 0.002, None),
            ("solo:sim-sage", 0.6, 0.001, 0.03),
            ("solo:sim-sprout", 0.4, 0.0001, 0.001),
            ("oracle", 1.0, 0.001, 0.5),  # an upper bound, never the baseline to beat
        ]
    )
    results = _results(
        {
            "conductor": [True] * 9 + [False],
            "solo:sim-sage": [True] * 6 + [False] * 4,
        }
    )
    routing = _routing(
        {
            "math": {"sim-sage": 0.8, "sim-sprout": 0.2},
            "code": {"sim-sage": 0.3, "sim-sprout": 0.7},
        },
        multi_step=0.25,
    )
    text = hl.evaluation_headline(summary, results, routing)
    assert text.startswith("**Winner: the Conductor**")
    assert "90.0% of 10 test questions against 60.0%" in text
    assert "solo:sim-sage (simulated worker)" in text and "30.0 points ahead" in text
    # the paired interval of a +30-point margin where the Conductor never loses a question
    low, high, n = hl.paired_difference_ci(results, "conductor", "solo:sim-sage")
    assert n == 10 and 0.0 <= low <= 0.3 <= high <= 0.6
    assert f"{100 * low:+.1f}".replace("-", "−") in text
    assert "exact McNemar p = 0.03" in text and "significant at the 5% level" in text
    assert "not significant" not in text
    assert "2.0× the worker cost per question" in text
    assert "oracle" in text and "100.0%" in text
    assert "to sim-sage (sim) in math 80%" in text and "to sim-sprout (sim) in code 70%" in text
    assert "25% of its workflows have more than one step" in text


def test_evaluation_headline_when_the_conductor_loses():
    summary = _summary(
        [
            ("conductor", 0.5, 0.004, None),
            ("warm-start", 0.9, 0.0001, 0.01),  # a Conductor variant, not a baseline
            ("router", 0.7, 0.001, 0.2),
            ("moa", 0.7, 0.008, 0.2),  # as accurate as the router, dearer: not the best
        ]
    )
    results = _results({"conductor": [True] * 5 + [False] * 5, "router": [True] * 7 + [False] * 3})
    text = hl.evaluation_headline(summary, results)
    assert text.startswith("**Winner: router** (the best baseline)")
    assert "70.0% of 10 test questions against 50.0% for the Conductor" in text
    assert "the Conductor is 20.0 points behind" in text
    assert "exact McNemar p = 0.20" in text
    assert "not significant at the 5% level" in text and "cannot tell" in text
    assert "4.0× the worker cost per question of router" in text


def test_the_handcrafted_pipeline_is_a_baseline_labelled_as_told_the_domain():
    summary = _summary(
        [
            ("conductor", 0.6, 0.004, None),
            ("router", 0.7, 0.001, 0.3),
            ("handcrafted", 0.8, 0.002, 0.1),  # the best baseline, unlike the oracle
            ("oracle", 1.0, 0.001, 0.01),
        ]
    )
    assert ev.best_baseline(summary)["system"] == "handcrafted"
    assert ev.system_label("handcrafted") == "handcrafted (told the domain)"
    assert ev.system_label("router") == "router"
    text = hl.evaluation_headline(summary)
    assert text.startswith("**Winner: handcrafted (told the domain)** (the best baseline)")


def test_evaluation_headline_tie_and_without_results():
    summary = _summary([("conductor", 0.6, 0.001, None), ("solo:a", 0.6, 0.001, 1.0)])
    text = hl.evaluation_headline(summary)
    assert text.startswith("**No winner:**") and "both answer 60.0%" in text
    assert "bootstrap" not in text  # no per-question results, no paired interval
    assert "1.0× the worker cost" in text


def test_evaluation_headline_needs_a_conductor_and_a_baseline():
    with pytest.raises(MissingInput, match="no Conductor row"):
        hl.evaluation_headline(_summary([("solo:a", 0.5, 0.001, None)]))
    with pytest.raises(MissingInput, match="no baseline"):
        hl.evaluation_headline(_summary([("conductor", 0.5, 0.001, None), ("oracle", 1, 0, 1)]))


def _history() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "step": [1, 2, 3],
            "grpo/reward/mean": [0.30, 0.50, 0.72],
            "grpo/reward/std": [0.6, 0.5, 0.4],
            "grpo/rollouts/parse_rate": [0.5, 0.8, 1.0],
            "grpo/workers/share/sim-sage": [0.2, 0.5, 0.9],
            "grpo/workers/share/sim-sprout": [0.8, 0.5, 0.1],
        }
    )


def test_training_headline_says_what_grpo_changed():
    info = {"sft": {"steps": 30, "final_loss": 0.1146, "reused": False}}
    text = hl.training_headline(_history(), info)
    assert text.startswith("**What GRPO changed** over 3 logged steps (1 → 3)")
    assert "the mean reward rose from 0.30 to 0.72" in text
    assert "parse as a workflow went from 50% to 100%" in text
    assert "sim-sage (simulated) 20% → 90%" in text and "sim-sprout (simulated) 80% → 10%" in text
    assert "calls sim-sage (simulated) most (90%)" in text
    assert "SFT, 30 steps) ended at loss 0.115" in text
    # with the per-step SFT loss logged, the headline gives its first and last value
    history = _history().assign(**{"sft/loss": [2.5, 1.0, 0.25]})
    assert "SFT) took the loss from 2.500 to 0.250 in 3 steps" in hl.training_headline(history)


def test_training_headline_when_the_reward_fell_and_when_there_is_none():
    falling = _history().assign(**{"grpo/reward/mean": [0.6, 0.5, 0.4]})
    assert "the mean reward fell from 0.60 to 0.40" in hl.training_headline(falling)
    with pytest.raises(MissingInput, match="reward/mean"):
        hl.training_headline(_history().drop(columns=["grpo/reward/mean"]))


def test_sft_loss_sources_in_order_and_a_plain_message_when_absent(tmp_path):
    logged = _history().assign(**{"sft/loss": [2.0, None, 1.0]})
    loss, source = tr.sft_loss(logged)
    assert list(loss["loss"]) == [2.0, 1.0] and "sft/loss" in source
    table = tmp_path / "sft_history.jsonl"
    table.write_text("\n".join(json.dumps({"step": s, "loss": 3.0 / s}) for s in (1, 2, 3)))
    loss, source = tr.sft_loss(_history(), {}, table)
    assert list(loss["step"]) == [1, 2, 3] and source == str(table)
    info = {"sft": {"steps": 2, "final_loss": 0.5, "history": [{"step": 1, "loss": 0.9}]}}
    loss, source = tr.sft_loss(None, info)
    assert list(loss["loss"]) == [0.9] and "adapter info" in source
    with pytest.raises(MissingInput, match=r"no per-step SFT loss.*final loss \(0\.500 after 2"):
        tr.sft_loss(_history(), {"sft": {"steps": 2, "final_loss": 0.5}})
    with pytest.raises(MissingInput, match="reused"):
        tr.sft_loss(_history(), {"sft": {"reused": True}})
    assert len(tr.sft_loss_figure(logged).axes) == 1


def test_rollout_samples_are_found_where_training_recorded_them(tmp_path):
    recorded = "data/06_models/conductor/runs/abc/rollout_samples.jsonl"
    info = {"rollout_samples": recorded}
    # relative to the project root, not to notebooks/ where the kernel runs
    assert tr.resolve_rollout_samples(None, info, tmp_path) == tmp_path / recorded
    assert tr.resolve_rollout_samples("/x/samples.jsonl", info, tmp_path).as_posix() == (
        "/x/samples.jsonl"
    )
    assert tr.resolve_rollout_samples(None, {}, tmp_path) is None
    with pytest.raises(MissingInput, match="does not exist"):
        tr.rollout_examples(tmp_path / recorded)


def test_reward_band_stays_within_the_reward_range():
    figure = tr.reward_figure(_history())  # mean ± std reaches 0.72 + 0.4 and 0.30 − 0.6
    ax = figure.axes[0]
    band = [c for c in ax.collections if len(c.get_paths())]
    assert band, "expected the ± std band"
    ys = band[0].get_paths()[0].vertices[:, 1]
    assert ys.min() >= 0.0 and ys.max() <= 1.0
    assert ys.max() == pytest.approx(1.0) and ys.min() == pytest.approx(0.0)


def test_counts_are_written_as_integers():
    decision = {
        "version": "1",
        "decision": "promoted",
        "figures": {"challenger": {"accuracy": 0.75, "cost_usd_per_q": 0.0009, "parse_rate": 0.96,
                                   "n": 24}, "champion": None},
    }  # fmt: skip
    table = next(p for p in ev.promotion_summary(decision) if isinstance(p, pd.DataFrame))
    table = table.set_index("figure")
    assert (
        table.loc["questions", "challenger"] == "24" and table.loc["questions", "champion"] == "—"
    )
    assert table.loc["accuracy", "challenger"] == "0.750"
    tidy = tidy_table(pd.DataFrame({"n": [24.0, None], "share": [0.5, 1.0]}))
    assert list(tidy["n"]) == [24, ""] and list(tidy["share"]) == [0.5, 1.0]


def test_sft_steps_do_not_count_as_training_steps(tmp_path):
    # SFT logs sft/loss at its own steps 1 … 5; GRPO ran 3 steps
    history = _history().merge(
        pd.DataFrame({"step": range(1, 6), "sft/loss": [2.0, 1.5, 1.0, 0.7, 0.5]}), how="outer"
    )
    assert list(tr.stage_steps(history)) == [1, 2, 3]
    assert tr.describe_history(history, "run x") == (
        "3 logged training steps and 5 SFT steps, read from run x."
    )
    history = history.assign(**{"grpo/domain/math/worker/sim-sage": [0.5, 1.0, 1.0, None, None]})
    figure = tr.routing_figure(history)
    assert figure.axes[0].get_xlim() == (1.0, 3.0)  # the GRPO steps, not the SFT ones
    assert tr.default_sft_history(tmp_path) is None
    table = tmp_path / "data" / "08_reporting" / "sft_history.csv"
    table.parent.mkdir(parents=True)
    table.write_text("step,loss,grad_norm,learning_rate\n1,2.0,1.0,0.0001\n2,1.0,0.5,0.0001\n")
    assert tr.default_sft_history(tmp_path) == table
    loss, source = tr.sft_loss(_history(), {}, tr.default_sft_history(tmp_path))
    assert list(loss["loss"]) == [2.0, 1.0] and source == str(table)
