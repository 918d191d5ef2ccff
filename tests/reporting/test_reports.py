"""The report notebooks run under papermill on a small fixture and become HTML pages with
embedded PNG plots and no code; a failing cell fails the run with its error and leaves the
partial notebook behind."""

from __future__ import annotations

import json
import re
import shutil
import time

import nbformat
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from conductor_pipeline.pipelines.reporting.nodes import (
    render_evaluation_report,
    render_training_report,
)
from conductor_pipeline.reporting import ReportFailed, execute_report
from tests.reporting.conftest import REPO

NOTEBOOKS = REPO / "notebooks"


def _images(html: str) -> int:
    """The embedded PNG figures; each must carry its own alternative text (nbconvert
    otherwise fills in a placeholder and warns in the run log)."""
    images = re.findall(r'<img[^>]+src="data:image/png;base64,[^>]*>', html)
    for image in images:
        alt = re.search(r'alt="([^"]*)"', image)
        assert alt and alt.group(1) and "No description" not in alt.group(1), image[:200]
    return len(images)


def _params(tmp_path) -> dict:
    return {
        "notebooks_dir": str(NOTEBOOKS),
        "output_dir": str(tmp_path / "reports"),
        "timeout_s": 300,
    }


def test_training_report_has_curves_from_the_mlflow_history(tmp_path, training_run):
    started = time.perf_counter()
    html = render_training_report(
        {"name": "conductor", "version": "1", "run_id": training_run},
        {"global_step": 8, "data_version": "abc123", "seconds": {"grpo": 12.5}},
        pd.DataFrame(),  # the MLflow run is the record; the table is only a fallback
        _params(tmp_path),
    )
    seconds = time.perf_counter() - started
    # reward, parse rate, worker usage, cost per rollout
    assert _images(html) >= 4, "expected the four training plots as embedded PNG images"
    assert "Start and end of training" in html and "conductor/1" in html
    assert "8 logged training steps, read from MLflow run" in html
    assert "rollout samples" in html  # the missing piece is named, not silently skipped
    assert "tr.reward_figure" not in html and "import json" not in html  # no code cells
    assert (tmp_path / "reports" / "training_report.ipynb").is_file()
    print(f"training report: papermill + HTML in {seconds:.1f} s")


def test_training_report_falls_back_to_the_history_table_and_shows_rollout_samples(
    tmp_path, tracking_uri
):
    history = pd.DataFrame(
        {
            "step": [1.0, 2.0, 3.0],
            "grpo/reward/mean": [0.1, 0.3, 0.5],
            "grpo/rollouts/parse_rate": [0.2, 0.6, 0.9],
            "grpo/workflow/cost_usd_mean": [0.001, 0.0012, 0.0011],
            "grpo/workers/share/sim-sage": [0.2, 0.4, 0.6],
            "grpo/workers/share/sim-coder": [0.8, 0.6, 0.4],
            "grpo/domain/math/worker/sim-sage": [0.0, 0.5, 1.0],
            "grpo/domain/math/worker/sim-coder": [1.0, 0.5, 0.0],
            "grpo/shape/single": [1.0, 0.5, 0.5],
            "grpo/shape/solve_check": [0.0, 0.5, 0.5],
            "grpo/workflow/multi_step_share": [0.0, 0.5, 0.5],
        }
    )
    samples = tmp_path / "samples.jsonl"
    samples.write_text(
        "\n".join(
            json.dumps({"step": s, "completion": f"model_id = [{s % 2}]  # step {s}", "reward": r})
            for s, r in ((1, 0.0), (1, 0.5), (3, 1.0))
        )
    )
    params = {**_params(tmp_path), "rollout_samples": str(samples)}
    html = render_training_report({}, {}, history, params)
    assert _images(html) >= 5  # the four curves and what the Conductor learns per domain
    assert "What the Conductor learns, per domain" in html
    assert "no training run id was given" not in html  # the fallback worked silently
    assert "step 3" in html and "Early steps" in html and "Late steps" in html
    # a history from before the attempt metrics: the warm start check says what it lacks
    check = html.split("Warm start check (GRPO step 1)")[1].split("<h2")[0]
    assert "0 of 1 targets met; not met: parse rate." in check
    assert "not logged by this run" in check
    assert "Multi-step attempts and what they earn" in html


def test_training_report_without_any_input_says_what_is_missing(
    tmp_path, tracking_uri, monkeypatch
):
    # a bare project: the checkout's own data/08_reporting/sft_history.csv, left by an
    # earlier `make run`, would otherwise be found and drawn
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    monkeypatch.setenv("CONDUCTOR_PROJECT_ROOT", str(root))  # the kernel inherits it
    html = render_training_report({}, {}, pd.DataFrame(), _params(tmp_path))
    assert "Not available" in html
    assert "no training metrics" in html
    assert _images(html) == 0


def test_evaluation_report_has_table_plots_examples_and_the_decision(
    tmp_path, evaluation_files, tracking_uri
):
    decision = {
        "version": "2",
        "decision": "refused",
        "previous_champion": "1",
        "champion": "1",
        "reasons": ["accuracy 0.500 vs champion 0.700 (beyond the allowed drop 0.050)"],
        "figures": {
            "challenger": {"accuracy": 0.5, "cost_usd_per_q": 0.002, "parse_rate": 0.9, "n": 12},
            "champion": {"accuracy": 0.7, "cost_usd_per_q": 0.002, "parse_rate": 0.95, "n": 12},
        },
        "champion_source": "conductor/1 was not re-evaluated",
        "gates": {"max_accuracy_drop": 0.05},
    }
    started = time.perf_counter()
    html = render_evaluation_report(
        pd.read_csv(evaluation_files["summary"]),
        pd.read_csv(evaluation_files["by_domain"]),
        pd.read_parquet(evaluation_files["results"]),
        json.loads(evaluation_files["run_info"].read_text()),
        decision,
        _params(tmp_path),
    )
    seconds = time.perf_counter() - started
    # Pareto plot, accuracy heat map, worker-choice and answer-routing heat maps, access patterns
    assert _images(html) >= 5
    for text in (
        "Summary (test split)",
        "95% CI",
        "solo:sim-sage (simulated worker)",
        "Answer routing: conductor and warm start",
        "How the Conductor plans, by domain and difficulty",
        "Does it spend more steps on hard questions?",
        "Workflow shapes",
        "solve_check",
        "Workflows that succeeded",
        "Workflows that failed",
        "decision: <strong>refused</strong>",
        "beyond the allowed drop",
        "models:/conductor/1",
    ):
        assert text in html, text
    assert "Registered versions" in html  # no registry in this store: a note, not a failure
    print(f"evaluation report: papermill + HTML in {seconds:.1f} s")


def test_evaluation_report_without_a_summary_fails_the_node_with_the_cells_error(
    tmp_path, tracking_uri
):
    with pytest.raises(
        ReportFailed, match=r"cell \d+.*MissingInput: The evaluation summary is not available"
    ) as failure:
        render_evaluation_report(None, None, None, {}, {}, _params(tmp_path))
    partial = tmp_path / "reports" / "evaluation_report.failed.ipynb"
    assert failure.value.partial_notebook == partial and partial.is_file()
    assert not (tmp_path / "reports" / "evaluation_report.ipynb").exists()


def test_a_failing_cell_keeps_the_partial_notebook_and_a_later_success_clears_it(tmp_path):
    template = tmp_path / "broken.ipynb"
    parameters = new_code_cell("fail = True")
    parameters.metadata["tags"] = ["parameters"]
    notebook = new_notebook(
        cells=[
            parameters,
            new_code_cell("print('first cell ran')"),
            new_code_cell("if fail:\n    raise ValueError('the answer is not 42')"),
            new_code_cell("print('never reached')"),
        ],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )
    nbformat.write(notebook, template)
    out = tmp_path / "out"
    with pytest.raises(ReportFailed) as failure:
        execute_report(template, out, {"fail": True})
    message = str(failure.value)
    assert "ValueError: the answer is not 42" in message
    assert "cell 3" in message  # papermill counts the injected-parameters cell too
    partial = nbformat.read(out / "broken.failed.ipynb", as_version=4)
    outputs = [o.get("text", "") for cell in partial.cells for o in cell.get("outputs", [])]
    assert any("first cell ran" in text for text in outputs)
    assert not any("never reached" in text for text in outputs)

    result = execute_report(template, out, {"fail": False})
    assert result.html_path.read_text() == result.html and "first cell ran" in result.html
    assert not (out / "broken.failed.ipynb").exists()


def test_a_missing_kernel_is_reported_with_the_fix(tmp_path):
    template = tmp_path / "any.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("1")]), template)
    with pytest.raises(ReportFailed, match="ipykernel install --sys-prefix --name no-such-kernel"):
        execute_report(template, tmp_path, {}, kernel_name="no-such-kernel")


def test_report_kernels_talk_over_local_sockets_and_log_no_tcp_warning(tmp_path, capfd):
    template = tmp_path / "tiny.ipynb"
    nbformat.write(
        new_notebook(
            cells=[new_code_cell("import os\nprint('pid', os.getpid())")],
            metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        ),
        template,
    )
    result = execute_report(template, tmp_path / "out", {})
    assert "pid" in result.html
    captured = capfd.readouterr()  # the kernel writes its log to the inherited stderr
    assert "without encryption" not in captured.err + captured.out
