"""Both reports rendered for real (papermill, then HTML) on a small prepared project, read as
a reader would: each opens with its headline, shows each table once, and holds no traceback,
no warning box (stderr output) and no object repr such as ``<Figure size …>``; the training
report finds the rollout samples training recorded and draws the logged SFT loss."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import mlflow
import nbformat
import pandas as pd
import pytest

from conductor_pipeline.pipelines.reporting.nodes import (
    render_evaluation_report,
    render_training_report,
)
from tests.reporting.conftest import REPO

NOTEBOOKS = REPO / "notebooks"
RUN_DIR = "data/06_models/conductor/runs/fp0123/"


def _params(tmp_path: Path) -> dict:
    return {
        "notebooks_dir": str(NOTEBOOKS),
        "output_dir": str(tmp_path / "reports"),
        "timeout_s": 300,
    }


def _assert_clean(html: str, executed: Path) -> None:
    """What a reader must not see, checked on the page and on the executed notebook."""
    assert "Traceback" not in html
    # the page's CSS names these classes too: look for them on an output element
    assert 'data-mime-type="application/vnd.jupyter.stderr"' not in html, "a warning box"
    assert 'class="jp-OutputArea-child jp-OutputArea-executeResult"' not in html, (
        "a value shown twice"
    )
    assert not re.search(r"(&lt;|<)Figure size \d", html), "a figure printed as its repr"
    assert not re.search(r"(&lt;|<)[\w.]+ object at 0x", html), "an object printed as its repr"
    notebook = nbformat.read(executed, as_version=4)
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            assert output.get("name") != "stderr", output.get("text")
            assert output["output_type"] != "error", output.get("evalue")
            # a value displayed again because it was the cell's last expression
            assert output["output_type"] != "execute_result", output.get("data")


def _first_heading_index(html: str) -> int:
    return html.index("<h2")


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A prepared project: pyproject.toml and the rollout samples training wrote, at the
    path (relative to the root) that the adapter info records."""
    root = tmp_path / "project"
    (root / RUN_DIR).mkdir(parents=True)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    samples = [
        {"stage": "grpo", "step": step, "question": f"What is {step} + {step}?",
         "completion": f"model_id = [{step % 2}]\nsubtasks = ['Solve it.']\naccess_list = [[]]",
         "reward": reward, "parsed": True}
        for step, reward in ((1, 0.0), (1, 0.5), (8, 1.0))
    ]  # fmt: skip
    (root / RUN_DIR / "rollout_samples.jsonl").write_text("\n".join(json.dumps(s) for s in samples))
    monkeypatch.setenv("CONDUCTOR_PROJECT_ROOT", str(root))  # the kernel inherits it
    return root


def test_training_report_page(tmp_path, project, training_run):
    client = mlflow.MlflowClient()
    for step, loss in enumerate((2.4, 1.1, 0.6, 0.3), start=1):
        client.log_metric(training_run, "sft/loss", loss, step=step)
    info = {
        "global_step": 8,
        "data_version": "abc123",
        "seconds": {"sft": 3.0, "grpo": 12.5},
        "rollout_samples": RUN_DIR + "rollout_samples.jsonl",  # as training records it
        "sft": {"steps": 4, "final_loss": 0.3, "reused": False},
    }
    html = render_training_report(
        {"name": "conductor", "version": "1", "run_id": training_run},
        info,
        pd.DataFrame(),
        _params(tmp_path),  # no reporting.rollout_samples: found from the adapter info
    )
    _assert_clean(html, tmp_path / "reports" / "training_report.ipynb")
    headline = html.index("What GRPO changed")
    assert headline < _first_heading_index(html), "the headline opens the report"
    assert "the mean reward rose from 0.28 to 0.84" in html
    assert "SFT) took the loss from 2.400 to 0.300 in 4 steps" in html
    assert html.count(">registered version<") == 1, "the overview table is shown once"
    assert "8 logged training steps and 4 SFT steps, read from MLflow run" in html
    assert (
        "Warm start: SFT loss" in html
        and "the MLflow metric sft/loss" not in html.split("Warm start: SFT loss")[0]
    )
    assert "Late steps (step 8)" in html and "What is 8 + 8?" in html
    assert "Not available" not in html.split("Example workflows")[1]


def test_training_report_page_without_sft_loss_says_so(tmp_path, project, training_run):
    html = render_training_report(
        {"name": "conductor", "version": "1", "run_id": training_run},
        {"sft": {"steps": 30, "final_loss": 0.115}},
        pd.DataFrame(),
        _params(tmp_path),
    )
    _assert_clean(html, tmp_path / "reports" / "training_report.ipynb")
    section = html.split("Warm start: SFT loss")[1].split("<h2")[0]
    assert "Not available" in section and "no per-step SFT loss" in section
    assert "only the final loss (0.115 after 30 steps)" in section


def test_evaluation_report_page(tmp_path, evaluation_files, tracking_uri, registry):
    decision = {
        "version": "3",
        "decision": "promoted",
        "previous_champion": None,
        "champion": "3",
        "reasons": ["no champion yet"],
        "figures": {
            "challenger": {"accuracy": 0.75, "cost_usd_per_q": 0.002, "parse_rate": 1.0, "n": 12},
            "champion": None,
        },
    }
    html = render_evaluation_report(
        pd.read_csv(evaluation_files["summary"]),
        pd.read_csv(evaluation_files["by_domain"]),
        pd.read_parquet(evaluation_files["results"]),
        json.loads(evaluation_files["run_info"].read_text()),
        decision,
        _params(tmp_path),
    )
    _assert_clean(html, tmp_path / "reports" / "evaluation_report.ipynb")
    headline = html.index("Winner:")
    assert headline < _first_heading_index(html), "the headline opens the report"
    opening = html[headline : _first_heading_index(html)]
    for text in ("test questions", "paired bootstrap CI", "McNemar p", "worker cost per question",
                 "What the Conductor learned"):  # fmt: skip
        assert text in opening, text
    assert "12.000000" not in html and re.search(r"<td>12</td>", html)
    # the registry table once, with each version once
    assert html.count("Registered versions") == 1
    registry_table = html.split("Registered versions")[1]
    assert registry_table.count("<table") == 1
