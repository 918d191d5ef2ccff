"""The evaluation report says, next to BigCodeBench's figures, that its unittest verdicts can
be forged by the code under test (they run in the candidate's process): evaluation only."""

from __future__ import annotations

import pandas as pd

from conductor_pipeline.evaluation.metrics import summarise, summarise_by_domain
from conductor_pipeline.pipelines.reporting.nodes import render_evaluation_report
from conductor_pipeline.reporting import evaluation as ev
from tests.reporting.conftest import REPO, make_results


def _with_bigcodebench(results: pd.DataFrame) -> pd.DataFrame:
    results = results.copy()
    code = results["domain"] == "code"
    results["source"] = results["source"].where(~code, "bigcodebench")
    return results


def test_the_note_names_bigcodebench_only_when_it_was_evaluated() -> None:
    plain = make_results()
    assert "bigcodebench" not in set(plain["source"])
    assert ev.forgeable_verdicts_notes(plain) == []
    assert ev.forgeable_verdicts_notes(None, None) == []
    assert ev.forgeable_verdicts_notes(plain, summarise_by_domain(plain, samples=50)) == []
    notes = ev.forgeable_verdicts_notes(_with_bigcodebench(plain))
    assert len(notes) == 1
    assert "BigCodeBench" in notes[0] and "forge" in notes[0]
    assert "never a training reward" in notes[0]
    # a per-source table (evaluation.report_by: source) alone is enough
    by_source = summarise_by_domain(_with_bigcodebench(plain), samples=50, by="source")
    assert ev.forgeable_verdicts_notes(None, by_source) == notes


def test_the_rendered_report_carries_the_note_next_to_the_summary(tmp_path) -> None:
    results = _with_bigcodebench(make_results())
    html = render_evaluation_report(
        summarise(results, samples=100),
        summarise_by_domain(results, samples=100),
        results,
        {"conductor": "models:/conductor/1 (version 1)", "conductor_variant": "conductor/1"},
        {},
        {
            "notebooks_dir": str(REPO / "notebooks"),
            "output_dir": str(tmp_path / "reports"),
            "timeout_s": 300,
        },
    )
    summary_at = html.index("Summary (test split)")
    note_at = html.index("<b>Warning:</b> BigCodeBench's figures")
    assert summary_at < note_at < html.index("Cost and accuracy")
    assert "never a training reward" in html
