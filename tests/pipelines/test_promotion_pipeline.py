"""The promotion pipeline's node on a real SQLite registry, `conductor promote` (gates from
recorded figures, rollback), and the composed pipelines."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from conductor_pipeline import cli, promotion
from conductor_pipeline.pipelines.promotion.nodes import (
    figures_from_summary,
    promote_challenger,
    promotion_metrics,
)

REPO = Path(__file__).resolve().parents[2]
PARAMS = {
    "gates": {"max_accuracy_drop": 0.05, "max_cost_increase": 0.10, "min_parse_rate": 0.5},
    "champion_system": "champion",
}


def summary(accuracy: float, cost: float = 0.002, parse_failures: int = 1, n: int = 12, extra=()):
    rows = [
        {"system": "conductor", "n": n, "accuracy": accuracy, "cost_usd_per_q": cost,
         "parse_failures": parse_failures},
        {"system": "solo:sim-sage", "n": n, "accuracy": 0.6, "cost_usd_per_q": 0.003,
         "parse_failures": 0},
        *extra,
    ]  # fmt: skip
    return pd.DataFrame(rows)


def results(question_ids=("q1", "q2", "q3")) -> pd.DataFrame:
    return pd.DataFrame({"system": "conductor", "question_id": list(question_ids)})


def run_info(version: str) -> dict:
    return {"conductor_variant": f"conductor/{version}"}


def promote(version: str, table: pd.DataFrame, info=None, questions=None, params=PARAMS):
    return promote_challenger(
        table,
        info if info is not None else run_info(version),
        results() if questions is None else questions,
        params,
    )


def tags(version: str) -> dict:
    return mlflow.MlflowClient().get_model_version("conductor", version).tags


def test_parse_rate_comes_from_the_summary_or_the_per_question_results():
    assert figures_from_summary(summary(0.5, parse_failures=3), "conductor").parse_rate == 0.75
    table = summary(0.5).drop(columns=["parse_failures"])
    per_question = pd.DataFrame({"system": ["conductor"] * 4, "parse_failure": [1, 0, 0, 0]})
    assert figures_from_summary(table, "conductor", per_question).parse_rate == 0.75
    with pytest.raises(ValueError, match="parse-rate gate cannot be checked"):
        figures_from_summary(table, "conductor")


def test_first_version_needs_the_parse_rate_floor_then_better_wins_and_worse_is_refused(
    registry,
):
    first, second, third = registry
    low = promote(first, summary(0.9, parse_failures=8))  # parse rate 0.33 < 0.5
    assert low["decision"] == "refused" and low["champion"] is None
    assert "parse rate 0.333 < floor 0.500" in tags(first)["promotion.reason"]

    ok = promote(first, summary(0.5))
    assert ok["decision"] == "promoted" and ok["champion"] == first
    recorded = json.loads(tags(first)["evaluation.figures"])
    assert recorded["accuracy"] == 0.5 and recorded["context"]["test_questions"]

    better = promote(second, summary(0.6, cost=0.0021))
    assert better["decision"] == "promoted"
    assert promotion.current_versions() == {"champion": second, "challenger": second}
    assert any(
        "figures were recorded when it was evaluated" in r and "the same test questions" in r
        for r in better["reasons"]
    )
    assert better["figures"]["champion"]["accuracy"] == 0.5

    worse = promote(third, summary(0.4, cost=0.003))
    assert worse["decision"] == "refused"
    assert promotion.current_versions() == {"champion": second, "challenger": third}
    reason = tags(third)["promotion.reason"]
    assert "beyond the allowed drop" in reason and "beyond +10%" in reason
    metrics = promotion_metrics(worse)
    assert metrics["promoted"]["value"] == 0.0 and metrics["challenger.accuracy"]["value"] == 0.4


def test_an_evaluation_of_something_unregistered_promotes_nothing(registry):
    first = registry[0]
    decision = promote(first, summary(0.9), info={"conductor_variant": "base:abc"})
    assert decision["decision"] == "skipped" and decision["version"] is None
    assert "measured base:abc" in decision["reasons"][0]
    assert promotion.current_versions() == {"champion": None, "challenger": None}
    assert "promotion.decision" not in tags(first)


def test_champion_row_of_the_evaluation_is_preferred_and_other_test_questions_are_flagged(
    registry,
):
    first, second, third = registry
    promote(first, summary(0.5))
    champion_row = {"system": "champion", "n": 12, "accuracy": 0.55, "cost_usd_per_q": 0.002,
                    "parse_failures": 0}  # fmt: skip
    decision = promote(second, summary(0.52, extra=[champion_row]))
    assert decision["decision"] == "promoted"  # a 0.03 drop is within the 0.05 allowed
    assert "evaluated alongside the challenger" in decision["champion_source"]
    assert decision["figures"]["champion"]["accuracy"] == 0.55

    strict = {**PARAMS, "require_same_test_questions": True}
    refused = promote(third, summary(0.9), questions=results(("x1", "x2")), params=strict)
    assert refused["decision"] == "refused"
    assert any("test questions differ" in r for r in refused["reasons"])
    assert promotion.current_versions()["champion"] == second


def test_a_version_from_the_champions_training_run_changes_nothing(registry):
    first, second, _ = registry
    promote(first, summary(0.5))
    client = mlflow.MlflowClient()
    client.set_model_version_tag("conductor", second, "run_fingerprint", "fp0")  # same as first
    decision = promote(second, summary(0.8))
    assert decision["decision"] == "unchanged" and decision["champion"] == first
    assert tags(second)["promotion.decision"] == "unchanged"
    again = promote(first, summary(0.5))
    assert again["decision"] == "unchanged" and "already the champion" in again["reasons"][0]


def test_a_champion_without_figures_keeps_its_place(registry):
    """A champion set by hand (no evaluation.figures) cannot be compared: the challenger is
    refused with the way out named, and the champion stays."""
    first, second, _ = registry
    mlflow.MlflowClient().set_registered_model_alias("conductor", "champion", first)
    decision = promote(second, summary(0.9))
    assert decision["decision"] == "refused" and decision["champion"] == first
    assert "has no recorded figures" in decision["reasons"][0]
    assert "conductor promote --version " + second in tags(second)["promotion.reason"]
    assert decision["figures"]["champion"] is None
    assert promotion.current_versions() == {"champion": first, "challenger": second}


def test_cli_promote_version_from_recorded_figures_and_rollback(registry, monkeypatch, capsys):
    monkeypatch.setenv("CONDUCTOR_PROJECT_ROOT", str(REPO))  # the gates of conf/base
    first, second, third = registry
    promote(first, summary(0.5))
    # version 2 was evaluated but refused (costlier than allowed), so it has recorded figures
    assert promote(second, summary(0.7, cost=0.01))["decision"] == "refused"

    assert cli.main(["promote", "--version", third]) == 1  # never evaluated
    assert "no recorded figures" in capsys.readouterr().err

    assert cli.main(["promote", "--version", second]) == 3  # the same gates, the same answer
    assert "beyond +10%" in capsys.readouterr().out

    promotion.record_figures(second, promotion.Figures(0.7, 0.002, 0.95, 12))
    assert cli.main(["promote", "--version", second, "--json"]) == 0
    outcome = json.loads(capsys.readouterr().out)
    assert outcome["decision"] == "promoted" and outcome["champion"] == second

    assert cli.main(["promote", "--rollback"]) == 0
    assert f"conductor/{second} -> conductor/{first}" in capsys.readouterr().out
    assert promotion.current_versions()["champion"] == first
    assert cli.main(["promote", "--rollback"]) == 1
    assert "nothing to roll back to" in capsys.readouterr().err


def test_registry_composes_the_loop_and_the_evaluation_report_follows_promotion():
    from conductor_pipeline.pipeline_registry import register_pipelines

    pipelines = register_pipelines()
    for name in ("data_prep", "training", "evaluation", "reporting", "promotion", "retraining"):
        assert name in pipelines, name
    order = [n.name for n in pipelines["__default__"].nodes]
    assert order.index("register_conductor") < order.index("run_evaluation")
    assert order.index("promote_challenger") < order.index("render_evaluation_report")
    retrain = [n.name for n in pipelines["retraining"].nodes]
    assert retrain[0] == "acquire_retraining_lock" and retrain[-1] == "release_retraining_lock"
    assert retrain.index("add_logged_questions") < retrain.index("deduplicate_tasks")
    # retraining continues from the champion's adapter; `make run` trains from the base model
    train = {
        name: next(n for n in pipelines[name].nodes if n.name == "train_conductor")
        for name in ("retraining", "__default__")
    }
    assert "params:retraining.start_from" in train["retraining"].inputs
    assert not any(i.startswith("params:retraining") for i in train["__default__"].inputs)


def test_an_unresolved_start_reference_trains_from_the_base_model(tmp_path, monkeypatch):
    from conductor_pipeline.pipelines.training.nodes import resolve_start_adapter

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    base = "smollm2-135m-instruct"
    assert resolve_start_adapter(None, base) is None
    assert resolve_start_adapter("models:/conductor@champion", base) is None  # no champion yet
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_start_adapter(str(tmp_path / "missing"), base)
    (tmp_path / "adapter").mkdir()
    assert resolve_start_adapter(str(tmp_path / "adapter"), base) == str(tmp_path / "adapter")
