"""Champion/challenger promotion of Conductor versions in the MLflow registry.

A newly registered version becomes ``challenger``. It replaces the ``champion`` only if it
passes every configured gate against the champion's figures on the same test split. The
decision, the figures and the reasons are written as tags on the challenger; aliases move
last, after every gate has passed, so an error on the way leaves the aliases as they were.
``rollback`` restores the champion that a promotion replaced.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from conductor_pipeline.config_checks import check_keys
from conductor_pipeline.registry import registered_model

CHAMPION, CHALLENGER = "champion", "challenger"
_PREVIOUS = "promotion.previous_champion"


@dataclass(frozen=True)
class Gates:
    """What a challenger must show against the champion (figures from the same test split).

    ``max_accuracy_drop``: accuracy may be lower by at most this much (absolute).
    ``max_cost_increase``: cost per question may be higher by at most this fraction.
    ``min_parse_rate``: share of questions with a parseable workflow, required even when there
    is no champion yet.
    ``max_slice_accuracy_drop``: on the new evaluation slice (served answers judged right
    since the last retraining), accuracy may be lower than the champion's by at most this
    much: 0 asks for improvement or parity. Applies only where a slice was measured.
    """

    max_accuracy_drop: float = 0.0
    max_cost_increase: float = 0.10
    min_parse_rate: float = 0.5
    max_slice_accuracy_drop: float = 0.0

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Gates:
        check_keys("promotion.gates", params, cls.__dataclass_fields__)
        return cls(**{k: float(v) for k, v in params.items()})


@dataclass
class Figures:
    """A version's evaluation figures that the gates read."""

    accuracy: float
    cost_usd_per_q: float
    parse_rate: float
    n: int


@dataclass
class Decision:
    promote: bool
    reasons: list[str]
    challenger: Figures
    champion: Figures | None
    gates: Gates
    checks: dict[str, bool] = field(default_factory=dict)

    def summary(self) -> str:
        verdict = "promote" if self.promote else "keep the champion"
        return f"{verdict}: " + "; ".join(self.reasons)


def decide(challenger: Figures, champion: Figures | None, gates: Gates) -> Decision:
    """Apply the gates; every failing gate contributes a reason, passing ones a short note."""
    checks: dict[str, bool] = {}
    reasons: list[str] = []
    checks["parse_rate"] = challenger.parse_rate >= gates.min_parse_rate
    reasons.append(
        f"parse rate {challenger.parse_rate:.3f} {'≥' if checks['parse_rate'] else '<'} floor {gates.min_parse_rate:.3f}"
    )
    if champion is None:
        reasons.append("no champion yet")
    else:
        drop = champion.accuracy - challenger.accuracy
        checks["accuracy"] = drop <= gates.max_accuracy_drop + 1e-12
        reasons.append(
            f"accuracy {challenger.accuracy:.3f} vs champion {champion.accuracy:.3f} "
            f"({'within' if checks['accuracy'] else 'beyond'} the allowed drop {gates.max_accuracy_drop:.3f})"
        )
        limit = champion.cost_usd_per_q * (1 + gates.max_cost_increase)
        checks["cost"] = challenger.cost_usd_per_q <= limit + 1e-15
        reasons.append(
            f"cost ${challenger.cost_usd_per_q:.6f}/q vs champion ${champion.cost_usd_per_q:.6f}/q "
            f"({'within' if checks['cost'] else 'beyond'} +{gates.max_cost_increase:.0%})"
        )
    return Decision(all(checks.values()), reasons, challenger, champion, gates, checks)


def gate_new_slice(decision: Decision, new_slice: dict[str, Any] | None) -> str | None:
    """Add the new-slice gate to ``decision`` (a check and a reason; ``promote`` turns false
    when it fails). ``new_slice``: the challenger's and the champion's figures on the slice
    (``challenger``, ``champion``) or ``skipped`` with the reason, which is returned (and
    noted among the reasons) when the gate does not apply."""
    new_slice = new_slice or {}
    skipped = new_slice.get("skipped")
    challenger, champion = new_slice.get("challenger"), new_slice.get("champion")
    if not skipped and (not challenger or not champion):
        skipped = "no figures of both versions on the new evaluation slice"
    if skipped:
        decision.reasons.append(f"new-slice gate skipped: {skipped}")
        return str(skipped)
    drop = float(champion["accuracy"]) - float(challenger["accuracy"])
    passed = drop <= decision.gates.max_slice_accuracy_drop + 1e-12
    decision.checks["new_slice"] = passed
    decision.reasons.append(
        f"new slice ({int(challenger.get('n') or 0)} served questions): accuracy "
        f"{float(challenger['accuracy']):.3f} vs champion {float(champion['accuracy']):.3f} "
        f"({'within' if passed else 'beyond'} the allowed drop "
        f"{decision.gates.max_slice_accuracy_drop:.3f})"
    )
    decision.promote = decision.promote and passed
    return None


def _client():
    from mlflow import MlflowClient

    from conductor_pipeline.registry import _use_project_store

    _use_project_store()
    return MlflowClient()


def _alias_version(client, alias: str, name: str) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        return str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def mark_challenger(version: str, *, name: str | None = None) -> None:
    """Point ``challenger`` at a newly registered version."""
    name = name or registered_model()
    _client().set_registered_model_alias(name, CHALLENGER, str(version))


def current_versions(*, name: str | None = None) -> dict[str, str | None]:
    name = name or registered_model()
    client = _client()
    return {alias: _alias_version(client, alias, name) for alias in (CHAMPION, CHALLENGER)}


def apply_decision(version: str, decision: Decision, *, name: str | None = None) -> dict[str, Any]:
    """Tag ``version`` with the decision; move ``champion`` to it only if it passed.

    Tags are written first; the alias moves last, so a failure before it leaves the aliases
    untouched, and a failed alias move is recorded on the version and re-raised.
    """
    name = name or registered_model()
    client = _client()
    version = str(version)
    previous = _alias_version(client, CHAMPION, name)
    tags = {
        "promotion.decision": "promoted" if decision.promote else "refused",
        "promotion.reason": decision.summary()[:5000],
        "promotion.figures": json.dumps(
            {
                "challenger": asdict(decision.challenger),
                "champion": asdict(decision.champion) if decision.champion else None,
            }
        ),
        "promotion.gates": json.dumps(asdict(decision.gates)),
        "promotion.decided_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if decision.promote and previous and previous != version:
        tags[_PREVIOUS] = previous
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    if decision.promote:
        try:
            client.set_registered_model_alias(name, CHAMPION, version)
        except Exception as err:
            client.set_model_version_tag(
                name, version, "promotion.decision", f"failed: {err}"[:5000]
            )
            raise
    return {"version": version, "previous_champion": previous, **tags}


def rollback(*, name: str | None = None) -> dict[str, str]:
    """Give ``champion`` back to the version the current champion replaced."""
    name = name or registered_model()
    client = _client()
    current = _alias_version(client, CHAMPION, name)
    if current is None:
        raise LookupError(f"{name} has no champion to roll back")
    previous = client.get_model_version(name, current).tags.get(_PREVIOUS)
    if not previous:
        raise LookupError(
            f"{name} version {current} replaced no earlier champion; nothing to roll back to"
        )
    client.set_registered_model_alias(name, CHAMPION, previous)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    client.set_model_version_tag(name, current, "promotion.rolled_back_at", stamp)
    client.set_model_version_tag(name, previous, "promotion.restored_at", stamp)
    return {"from": current, "to": previous}


# -- recorded figures ---------------------------------------------------------------------------
# A version's evaluated figures are kept as a tag on it, so that a later decision (the next
# challenger, or `conductor promote --version N`) can compare against them without
# re-evaluating. ``context`` says what they were measured on (test questions, evaluation run).
FIGURES_TAG = "evaluation.figures"


def record_figures(
    version: str,
    figures: Figures,
    context: dict[str, Any] | None = None,
    *,
    name: str | None = None,
) -> None:
    """Tag ``version`` with its evaluated figures (and what they were measured on)."""
    name = name or registered_model()
    payload = {**asdict(figures), "context": context or {}}
    _client().set_model_version_tag(name, str(version), FIGURES_TAG, json.dumps(payload))


def recorded_figures(
    version: str, *, name: str | None = None
) -> tuple[Figures, dict[str, Any]] | None:
    """The figures recorded for ``version`` and their context: its ``evaluation.figures``
    tag, else the challenger figures of its last promotion decision; ``None`` if neither."""
    name = name or registered_model()
    tags = _client().get_model_version(name, str(version)).tags or {}
    for key in (FIGURES_TAG, "promotion.figures"):
        try:
            data = json.loads(tags.get(key) or "null")
        except ValueError:
            continue
        if key == "promotion.figures" and isinstance(data, dict):
            data = data.get("challenger")
        if not isinstance(data, dict):
            continue
        try:
            figures = Figures(
                accuracy=float(data["accuracy"]),
                cost_usd_per_q=float(data["cost_usd_per_q"]),
                parse_rate=float(data["parse_rate"]),
                n=int(data["n"]),
            )
        except (KeyError, TypeError, ValueError):
            continue
        context = dict(data.get("context") or {})
        context.setdefault("recorded_in", key)
        return figures, context
    return None
