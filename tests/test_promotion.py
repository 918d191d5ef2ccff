"""Promotion gates and alias moves on a real (SQLite) MLflow registry."""

from __future__ import annotations

import json

import mlflow
import pytest

from conductor_pipeline import promotion
from conductor_pipeline.promotion import Decision, Figures, Gates, apply_decision, decide, rollback

GATES = Gates(max_accuracy_drop=0.01, max_cost_increase=0.10, min_parse_rate=0.8)


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A registry with three versions of `conductor`, each holding a (fake) adapter folder."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = mlflow.create_experiment(
        "promotion", artifact_location=str(tmp_path / "artifacts")
    )
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    client = mlflow.MlflowClient()
    client.create_registered_model("conductor")
    versions = []
    for _ in range(3):
        with mlflow.start_run(experiment_id=experiment) as run:
            mlflow.log_artifacts(str(adapter), "adapter")
        source = f"{run.info.artifact_uri}/adapter"
        created = client.create_model_version("conductor", source, run_id=run.info.run_id)
        versions.append(str(created.version))
    return versions


def test_first_version_needs_only_the_parse_rate_floor():
    assert decide(Figures(0.2, 0.01, 0.9, 40), None, GATES).promote
    refused = decide(Figures(0.9, 0.01, 0.5, 40), None, GATES)
    assert not refused.promote and "parse rate 0.500 < floor 0.800" in refused.summary()


@pytest.mark.parametrize(
    ("challenger", "promote", "phrase"),
    [
        (Figures(0.61, 0.010, 0.95, 40), True, "within the allowed drop"),
        (Figures(0.595, 0.010, 0.95, 40), True, "within the allowed drop"),
        (Figures(0.55, 0.010, 0.95, 40), False, "beyond the allowed drop"),
        (Figures(0.70, 0.012, 0.95, 40), False, "beyond +10%"),
        (Figures(0.70, 0.010, 0.70, 40), False, "< floor"),
    ],
)
def test_gates_against_a_champion(challenger, promote, phrase):
    champion = Figures(0.60, 0.010, 0.95, 40)
    decision = decide(challenger, champion, GATES)
    assert decision.promote is promote
    assert phrase in decision.summary()


def test_better_version_is_promoted_worse_refused_with_reasons_in_tags(registry):
    first, second, third = registry
    champion = Figures(0.5, 0.01, 0.9, 40)
    apply_decision(first, decide(champion, None, GATES))
    assert promotion.current_versions()["champion"] == first

    promotion.mark_challenger(second)
    better = decide(Figures(0.7, 0.009, 0.95, 40), champion, GATES)
    apply_decision(second, better)
    assert promotion.current_versions() == {"champion": second, "challenger": second}

    promotion.mark_challenger(third)
    worse = decide(Figures(0.4, 0.02, 0.95, 40), Figures(0.7, 0.009, 0.95, 40), GATES)
    apply_decision(third, worse)
    assert promotion.current_versions() == {"champion": second, "challenger": third}

    tags = mlflow.MlflowClient().get_model_version("conductor", third).tags
    assert tags["promotion.decision"] == "refused"
    assert (
        "beyond the allowed drop" in tags["promotion.reason"]
        and "beyond +10%" in tags["promotion.reason"]
    )
    assert json.loads(tags["promotion.figures"])["challenger"]["accuracy"] == 0.4
    promoted = mlflow.MlflowClient().get_model_version("conductor", second).tags
    assert (
        promoted["promotion.decision"] == "promoted"
        and promoted["promotion.previous_champion"] == first
    )


def test_rollback_restores_the_previous_champion(registry):
    first, second, _ = registry
    apply_decision(first, decide(Figures(0.5, 0.01, 0.9, 40), None, GATES))
    apply_decision(second, decide(Figures(0.6, 0.01, 0.9, 40), Figures(0.5, 0.01, 0.9, 40), GATES))
    assert rollback() == {"from": second, "to": first}
    assert promotion.current_versions()["champion"] == first
    with pytest.raises(LookupError, match="nothing to roll back to"):
        rollback()


def test_failed_alias_move_leaves_the_aliases_and_records_the_failure(registry, monkeypatch):
    first, second, _ = registry
    apply_decision(first, decide(Figures(0.5, 0.01, 0.9, 40), None, GATES))

    def broken(self, name, alias, version):
        raise RuntimeError("registry unavailable")

    decision: Decision = decide(Figures(0.9, 0.01, 0.9, 40), Figures(0.5, 0.01, 0.9, 40), GATES)
    with monkeypatch.context() as patch:
        patch.setattr(mlflow.MlflowClient, "set_registered_model_alias", broken)
        with pytest.raises(RuntimeError, match="registry unavailable"):
            apply_decision(second, decision)
    assert promotion.current_versions()["champion"] == first
    tags = mlflow.MlflowClient().get_model_version("conductor", second).tags
    assert tags["promotion.decision"].startswith("failed: registry unavailable")
