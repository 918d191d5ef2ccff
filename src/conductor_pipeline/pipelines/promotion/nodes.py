"""promotion nodes: the version the evaluation measured becomes ``challenger``, is gated
against the ``champion`` with the evaluation's figures, and the decision is written on the
version (and, when it passes, ``champion`` moves to it). The gate logic is
``conductor_pipeline.promotion``; this module finds the version and the figures.

Where the figures come from:

- the challenger: the ``conductor`` row of the evaluation summary; the evaluation run info
  names the version it measured (``conductor/<version>``; in the default and retraining
  pipelines the version training just registered). An evaluation of anything else (the base
  policy, an adapter folder) promotes nothing;
- the champion: a summary row named ``promotion.champion_system`` when the evaluation
  evaluated the champion alongside, else the figures recorded on the champion version when
  it was evaluated (``evaluation.figures`` tag) — the decision's reasons say which, and
  whether those were measured on the same test questions.
"""

from __future__ import annotations

import logging
import math
import re
import time
from typing import Any

import pandas as pd

from conductor_pipeline import promotion
from conductor_pipeline.config_checks import check_keys
from conductor_pipeline.hashing import content_hash
from conductor_pipeline.promotion import Figures, Gates
from conductor_pipeline.serving.models import PUBLIC_NAME

logger = logging.getLogger(__name__)

_KNOWN_KEYS = {"gates", "champion_system", "require_same_test_questions"}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def promotion_settings(params: dict[str, Any]) -> tuple[Gates, str, bool]:
    """The ``promotion`` parameters checked: the gates, the champion's system name in the
    evaluation results, and whether both versions must share their test questions."""
    params = dict(params or {})
    check_keys("promotion", params, _KNOWN_KEYS)
    gates = Gates.from_params(dict(params.get("gates") or {}))
    return (
        gates,
        str(params.get("champion_system") or "champion"),
        bool(params.get("require_same_test_questions", False)),
    )


def test_questions_fingerprint(results: pd.DataFrame | None, system: str = "conductor") -> str:
    """A short hash of the question ids the ``system`` was evaluated on."""
    if results is None or results.empty or "question_id" not in results:
        return ""
    ids = sorted(set(results.loc[results["system"] == system, "question_id"].astype(str)))
    return content_hash("\n".join(ids).encode()) if ids else ""


def figures_from_summary(
    summary: pd.DataFrame, system: str, results: pd.DataFrame | None = None
) -> Figures | None:
    """Accuracy, cost per question, parse rate (questions with a parseable workflow) and n
    of ``system``; ``None`` when the summary has no such row."""
    rows = summary[summary["system"] == system]
    if rows.empty:
        return None
    row = rows.iloc[0]
    n = int(row["n"])
    if "parse_failures" in row and not pd.isna(row["parse_failures"]):
        parse_rate = (1.0 - float(row["parse_failures"]) / n) if n else 0.0
    elif results is not None and "parse_failure" in results:
        mine = results[results["system"] == system]
        if "split" in mine:
            mine = mine[mine["split"] == "test"]
        parse_rate = 1.0 - float(mine["parse_failure"].astype(bool).mean()) if len(mine) else 0.0
    else:
        raise ValueError(
            f"evaluation summary row {system!r} has no parse_failures column and no "
            "per-question results were given: the parse-rate gate cannot be checked"
        )
    return Figures(
        accuracy=float(row["accuracy"]),
        cost_usd_per_q=float(row["cost_usd_per_q"]),
        parse_rate=parse_rate,
        n=n,
    )


def _tag_version(version: str, decision: str, reason: str) -> None:
    client = promotion._client()
    for key, value in {
        "promotion.decision": decision,
        "promotion.reason": reason[:5000],
        "promotion.decided_at": _now(),
    }.items():
        client.set_model_version_tag(promotion.registered_model(), version, key, value)


def _version_tags(version: str | None) -> dict[str, str]:
    if not version:
        return {}
    return dict(
        promotion._client().get_model_version(promotion.registered_model(), version).tags or {}
    )


def _outcome(version: str, decision: str, reasons: list[str], **extra: Any) -> dict[str, Any]:
    current = promotion.current_versions()
    return {
        "version": version,
        "decision": decision,
        "promote": decision == "promoted",
        "reasons": reasons,
        "champion": current[promotion.CHAMPION],
        "challenger": current[promotion.CHALLENGER],
        "decided_at": _now(),
        **extra,
    }


def champion_figures(
    champion: str,
    summary: pd.DataFrame,
    results: pd.DataFrame | None,
    champion_system: str,
    test_questions: str,
) -> tuple[Figures | None, str, bool]:
    """The champion's figures, a phrase saying where they come from, and whether they were
    measured on the same test questions as the challenger's."""
    evaluated = figures_from_summary(summary, champion_system, results)
    if evaluated is not None:
        return (
            evaluated,
            f"conductor/{champion} evaluated alongside the challenger on the same test "
            f"questions (summary row {champion_system!r})",
            True,
        )
    recorded = promotion.recorded_figures(champion)
    if recorded is None:
        return None, f"conductor/{champion} has no recorded figures", False
    figures, context = recorded
    same = bool(test_questions) and context.get("test_questions") == test_questions
    when = context.get("evaluated_at") or "an earlier run"
    where = "the same test questions" if same else "different or unknown test questions"
    return (
        figures,
        f"conductor/{champion} was not re-evaluated: its figures were recorded when it was "
        f"evaluated ({when}), on {where}",
        same,
    )


def evaluated_version(evaluation_run_info: dict[str, Any]) -> str | None:
    """The registry version the evaluation measured as ``conductor`` (``conductor/<N>``),
    or ``None`` when it measured something else (the base policy, a folder, an endpoint)."""
    variant = str((evaluation_run_info or {}).get("conductor_variant") or "")
    # the served id of a registry version (ServedModel.id): the public name, whatever the
    # registered model of the profile is called
    match = re.fullmatch(rf"{PUBLIC_NAME}/(\d+)", variant)
    return match.group(1) if match else None


def _skipped(evaluation_run_info: dict[str, Any], before: dict[str, str | None]) -> dict[str, Any]:
    """The record of an evaluation that measured no registered version: nothing to decide."""
    variant = (evaluation_run_info or {}).get("conductor_variant") or "nothing named"
    reason = (
        f"nothing to promote: the evaluation measured {variant} as 'conductor', not a "
        f"registered version of {promotion.registered_model()}"
    )
    logger.warning("promotion: %s", reason)
    return {
        "version": None,
        "decision": "skipped",
        "promote": False,
        "reasons": [reason],
        "champion": before[promotion.CHAMPION],
        "challenger": before[promotion.CHALLENGER],
        "previous_champion": before[promotion.CHAMPION],
        "decided_at": _now(),
    }


def _record_challenger(
    version: str, summary: pd.DataFrame, results: pd.DataFrame | None
) -> tuple[Figures, str]:
    """The challenger's figures from the summary, recorded on its version (with the test
    questions' fingerprint, also returned) so that a later run can compare against them."""
    challenger = figures_from_summary(summary, "conductor", results)
    if challenger is None:
        raise ValueError("evaluation summary has no 'conductor' row")
    test_questions = test_questions_fingerprint(results)
    promotion.record_figures(
        version,
        challenger,
        {
            "test_questions": test_questions,
            "evaluated_at": _now(),
            "conductor_variant": f"conductor/{version}",
        },
    )
    return challenger, test_questions


def _same_training_run(version: str, champion: str | None) -> str | None:
    """Why ``version`` brings nothing new (it comes from the champion's training run), or
    ``None``: a retraining that resumed a finished run registers the same adapter again."""
    fingerprint = _version_tags(version).get("run_fingerprint")
    if not (champion and fingerprint):
        return None
    if fingerprint != _version_tags(champion).get("run_fingerprint"):
        return None
    return (
        f"conductor/{version} comes from the same training run (fingerprint "
        f"{fingerprint}) as the champion conductor/{champion}: nothing new to promote"
    )


def _gate_against_champion(
    version: str,
    champion: str | None,
    challenger: Figures,
    test_questions: str,
    summary: pd.DataFrame,
    results: pd.DataFrame | None,
    settings: tuple[Gates, str, bool],
    new_slice: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Decide with the gates against the champion's figures (from this evaluation or those
    recorded on the champion), and on the new evaluation slice when one was measured; apply
    the decision; refuse when the champion has none."""
    gates, champion_system, require_same = settings
    champion_figs, source, same = None, "", True
    notes: list[str] = []
    challenger_only = {"challenger": vars(challenger), "champion": None}
    if champion:
        champion_figs, source, same = champion_figures(
            champion, summary, results, champion_system, test_questions
        )
        notes.append(f"champion figures: {source}")
        if champion_figs is None:
            reason = (
                f"{source}; the gates cannot compare, so the champion stays "
                f"(promote by hand with `conductor promote --version {version}` once it has figures)"
            )
            _tag_version(version, "refused", reason)
            return _outcome(
                version,
                "refused",
                [reason],
                previous_champion=champion,
                figures=challenger_only,
                gates=vars(gates),
            )
    decision = promotion.decide(challenger, champion_figs, gates)
    if new_slice is not None and champion_figs is not None:
        skipped = promotion.gate_new_slice(decision, new_slice)
        if skipped:
            logger.info("promotion of conductor/%s: new-slice gate skipped: %s", version, skipped)
    if champion and not same:
        notes.append("the comparison is indicative: the test questions differ")
        if require_same:
            decision.promote = False
            notes.append("promotion.require_same_test_questions is on, so the champion stays")
    decision.reasons.extend(notes)
    applied = promotion.apply_decision(version, decision)
    logger.info("promotion of conductor/%s: %s", version, decision.summary())
    return _outcome(
        version,
        applied["promotion.decision"],
        decision.reasons,
        previous_champion=champion,
        figures={**challenger_only, "champion": vars(champion_figs) if champion_figs else None},
        champion_source=source or None,
        checks=decision.checks,
        gates=vars(gates),
        test_questions=test_questions,
        **({"new_slice": new_slice} if new_slice is not None else {}),
    )


def promote_challenger(
    evaluation_summary: pd.DataFrame,
    evaluation_run_info: dict[str, Any],
    evaluation_results: pd.DataFrame,
    params: dict[str, Any],
    new_slice: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Mark the version the evaluation measured ``challenger`` (in the default and retraining
    pipelines: the version training just registered), gate it against the champion (on the
    fixed test set and, in retraining, on ``new_slice``: both versions' figures on the served
    questions judged since the last run, see ``pipelines.retraining.sources``), record
    the decision on the version (``promotion.*`` tags), move ``champion`` if it passed.
    Returns the decision record shown in the evaluation report.

    The version comes from the evaluation run info rather than from training's output, so
    the figures are always those of the version decided on, and ``kedro run --pipelines
    promotion`` decides on whatever the last evaluation measured."""
    settings = promotion_settings(params)
    version = evaluated_version(evaluation_run_info)
    before = promotion.current_versions()
    champion = before[promotion.CHAMPION]
    if version is None:
        return _skipped(evaluation_run_info, before)
    if champion == version:
        reasons = [f"conductor/{version} is already the champion; nothing to decide"]
        return _outcome(version, "unchanged", reasons, previous_champion=champion)
    promotion.mark_challenger(version)
    results = evaluation_results if isinstance(evaluation_results, pd.DataFrame) else None
    challenger, test_questions = _record_challenger(version, evaluation_summary, results)
    same_run = _same_training_run(version, champion)
    if same_run is not None:
        _tag_version(version, "unchanged", same_run)
        return _outcome(
            version,
            "unchanged",
            [same_run],
            previous_champion=champion,
            figures={"challenger": vars(challenger), "champion": None},
            gates=vars(settings[0]),
        )
    return _gate_against_champion(
        version,
        champion,
        challenger,
        test_questions,
        evaluation_summary,
        results,
        settings,
        new_slice,
    )


def _finite(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def promotion_metrics(promotion_decision: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``promotion.promoted`` (0/1) and the challenger's gated figures, for MLflow."""
    metrics = {"promoted": {"value": float(bool(promotion_decision.get("promote"))), "step": 0}}
    challenger = (promotion_decision.get("figures") or {}).get("challenger") or {}
    for key in ("accuracy", "cost_usd_per_q", "parse_rate"):
        if _finite(challenger.get(key)):
            metrics[f"challenger.{key}"] = {"value": float(challenger[key]), "step": 0}
    return metrics


def promote_recorded(version: str | None, params: dict[str, Any]) -> dict[str, Any]:
    """Gate ``version`` (default: the current challenger) against the champion with the
    figures recorded on both versions; used by ``conductor promote``."""
    gates, _, require_same = promotion_settings(params)
    before = promotion.current_versions()
    version = str(version) if version else before[promotion.CHALLENGER]
    if not version:
        raise LookupError("no challenger to promote; give --version N")
    champion = before[promotion.CHAMPION]
    if champion == version:
        return _outcome(
            version,
            "unchanged",
            [f"conductor/{version} is already the champion; nothing to decide"],
            previous_champion=champion,
        )
    recorded = promotion.recorded_figures(version)
    if recorded is None:
        raise LookupError(
            f"conductor/{version} has no recorded figures (no evaluation.figures or "
            "promotion.figures tag); evaluate it first"
        )
    challenger, context = recorded
    promotion.mark_challenger(version)
    champion_figs, notes, same = None, [], True
    if champion:
        found = promotion.recorded_figures(champion)
        if found is None:
            raise LookupError(
                f"the champion conductor/{champion} has no recorded figures to compare with"
            )
        champion_figs, champion_context = found
        same = bool(context.get("test_questions")) and context.get(
            "test_questions"
        ) == champion_context.get("test_questions")
        notes.append(
            "figures recorded on both versions, "
            + ("on the same test questions" if same else "on different or unknown test questions")
        )
    decision = promotion.decide(challenger, champion_figs, gates)
    if champion and not same and require_same:
        decision.promote = False
        notes.append("promotion.require_same_test_questions is on, so the champion stays")
    decision.reasons.extend(notes)
    applied = promotion.apply_decision(version, decision)
    return _outcome(
        version,
        applied["promotion.decision"],
        decision.reasons,
        previous_champion=champion,
        figures={
            "challenger": vars(challenger),
            "champion": vars(champion_figs) if champion_figs else None,
        },
        gates=vars(gates),
    )
