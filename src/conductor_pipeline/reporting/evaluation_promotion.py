"""The promotion decision against the previous champion and the registered versions of the
Conductor, as the evaluation report shows them."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from conductor_pipeline.reporting.display import MissingInput

# the figures of the promotion table, each with how it is written (a count stays an int)
_FIGURE_FORMATS = {
    "accuracy": "{:.3f}",
    "cost_usd_per_q": "{:.6f}",
    "parse_rate": "{:.3f}",
    "n": "{:.0f}",
}

_FIGURE_LABELS = {
    "accuracy": "accuracy",
    "cost_usd_per_q": "cost $/q",
    "parse_rate": "parse rate",
    "n": "questions",
}


def _figure_text(key: str, value: Any) -> str:
    if not isinstance(value, int | float) or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return _FIGURE_FORMATS[key].format(value)


def _figures_row(figures: dict[str, Any] | None) -> dict[str, Any]:
    figures = figures or {}
    return {k: figures.get(k) for k in _FIGURE_FORMATS}


def promotion_summary(decision: dict[str, Any]) -> list[Any]:
    """The decision on the challenger, its reasons, and the figures side by side."""
    verdict = decision.get("decision", "unknown")
    version = decision.get("version")
    previous = decision.get("previous_champion")
    now = decision.get("champion")
    before_text = f"`conductor/{previous}`" if previous else "none"
    now_text = f"`conductor/{now}`" if now else "none"
    parts: list[Any] = [
        f"**Challenger:** `conductor/{version}` — decision: **{verdict}**. "
        f"Champion before: {before_text}; champion now: {now_text}."
    ]
    reasons = decision.get("reasons") or []
    if reasons:
        parts.append("\n".join(f"- {r}" for r in reasons))
    figures = decision.get("figures") or {}
    challenger, champion = figures.get("challenger"), figures.get("champion")
    if challenger or champion:
        table = pd.DataFrame(
            {
                "challenger": _figures_row(challenger),
                "champion": _figures_row(champion),
            }
        )
        # the row labels are what each figure is: a column of their own, in words
        table.index = [_FIGURE_LABELS[k] for k in table.index]
        table.index.name = "figure"
        if challenger and champion:
            table["difference"] = [
                (c - p) if isinstance(c, int | float) and isinstance(p, int | float) else None
                for c, p in zip(table["challenger"], table["champion"], strict=True)
            ]
        # written out per row: a float column would print the count n as 24.000000
        for column in table.columns:
            table[column] = [
                _figure_text(k, v) for k, v in zip(_FIGURE_FORMATS, table[column], strict=True)
            ]
        parts.append(table.reset_index())
    if decision.get("champion_source"):
        parts.append(f"*Champion figures: {decision['champion_source']}.*")
    gates = decision.get("gates")
    if gates:
        parts.append("*Gates:* " + ", ".join(f"{k} = {v}" for k, v in gates.items()))
    return parts


def registry_versions(tracking_uri: str, name: str = "conductor", limit: int = 10) -> pd.DataFrame:
    """The latest registered versions with their aliases and promotion decisions."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        model = client.get_registered_model(name)
    except MlflowException as err:
        raise MissingInput(f"no registered model {name!r} in {tracking_uri}") from err
    aliases: dict[str, list[str]] = {}
    for alias, version in (model.aliases or {}).items():
        aliases.setdefault(str(version), []).append(alias)
    versions = client.search_model_versions(f"name='{name}'")
    rows = []
    for mv in sorted(versions, key=lambda v: int(v.version), reverse=True)[:limit]:
        tags = mv.tags or {}
        figures = {}
        for key in ("evaluation.figures", "promotion.figures"):
            try:
                data = json.loads(tags.get(key) or "{}")
            except ValueError:
                continue
            figures = data.get("challenger", data) if key == "promotion.figures" else data
            if figures:
                break
        rows.append(
            {
                "version": int(mv.version),
                "aliases": ", ".join(sorted(aliases.get(str(mv.version), []))),
                "decision": tags.get("promotion.decision", ""),
                "accuracy": figures.get("accuracy"),
                "cost $/q": figures.get("cost_usd_per_q"),
                "parse rate": figures.get("parse_rate"),
                "reason": str(tags.get("promotion.reason", ""))[:200],
            }
        )
    if not rows:
        raise MissingInput(f"registered model {name!r} has no versions")
    return pd.DataFrame(rows)
