"""`kedro run` that cannot start: one line naming the fix, a non-zero exit status, no
traceback unless --verbose, and no MLflow run left behind."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_run_log import REPO, _make_env

KEDRO = Path(sys.executable).parent / "kedro"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the project's configuration (no data, no conf/local), with its own store."""
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    shutil.copytree(REPO / "conf", root / "conf", ignore=shutil.ignore_patterns("local"))
    (root / "conf" / "local").mkdir()
    (root / "mlruns").mkdir()
    return root


def _store(root: Path) -> Path:
    return root / "mlruns" / "mlflow.db"


def _kedro_run(root: Path, *args: str) -> tuple[int, str]:
    env = _make_env(MLFLOW_TRACKING_URI=f"sqlite:///{_store(root)}")
    done = subprocess.run(
        [str(KEDRO), "run", *args], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    return done.returncode, done.stdout + done.stderr


def _mlflow_runs(root: Path) -> int:
    if not _store(root).is_file():
        return 0
    with sqlite3.connect(_store(root)) as db:
        if not db.execute("SELECT name FROM sqlite_master WHERE name = 'runs'").fetchall():
            return 0
        return db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]


def _assert_one_line(code: int, log: str, expected: str) -> None:
    assert code != 0, log[-3000:]
    assert "Traceback" not in log and 'File "' not in log, log[-3000:]
    # Kedro's "Using ... logging.yml" line, then the error
    assert len(log.strip().splitlines()) <= 5, log[-3000:]
    assert f"error: {expected}" in log, log[-3000:]


CASES = {
    "wrong pipeline name": (
        ["--pipelines", "evaluaton"],
        "no pipeline 'evaluaton'; did you mean 'evaluation'? (kedro registry list shows all)",
    ),
    "ill-typed parameter": (
        ["--pipelines", "evaluation", "--params", "evaluation.test_per_domain=abc"],
        "evaluation.test_per_domain: must be a positive integer or null, got 'abc' "
        "(fix it in conf/*/parameters*.yml or in --params)",
    ),
    "unknown parameter": (
        ["--pipelines", "evaluation", "--params", "evaluaton.test_per_domain=3"],
        "unknown parameter 'evaluaton.test_per_domain' in --params; "
        "did you mean 'evaluation.test_per_domain'?",
    ),
    "missing input file": (
        ["--pipelines", "evaluation"],
        "input 'test_tasks' is missing: data/05_model_input/test_tasks.parquet does not exist; "
        "run `kedro run --pipelines data_prep` first (it writes test_tasks)",
    ),
    "missing configuration environment": (
        ["--env", "gpuu"],
        "no configuration environment 'gpuu'",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_run_that_cannot_start_prints_one_line_naming_the_fix_and_leaves_no_mlflow_run(
    project, case
):
    args, expected = CASES[case]
    code, log = _kedro_run(project, *args)
    _assert_one_line(code, log, expected)
    assert _mlflow_runs(project) == 0


def test_a_parameter_a_node_needs_that_is_not_configured_is_named_before_the_run(project):
    (project / "conf" / "base" / "parameters_data_prep.yml").unlink()
    code, log = _kedro_run(project, "--pipelines", "data_prep")
    _assert_one_line(
        code,
        log,
        "missing parameter 'data_prep' (node 'collect_tasks' reads params:data_prep)",
    )
    assert _mlflow_runs(project) == 0


def test_verbose_prints_the_traceback_above_the_same_line(project):
    code, log = _kedro_run(project, "--pipelines", "evaluaton", "--verbose")
    assert code != 0
    assert "Traceback (most recent call last)" in log
    assert log.strip().splitlines()[-1] == (
        "error: no pipeline 'evaluaton'; did you mean 'evaluation'? (kedro registry list shows all)"
    )


# -- errors met during the run (after the checks), in process ---------------------------------


def test_a_file_missing_when_a_node_loads_it_is_one_line():
    from kedro.io import DatasetError

    from conductor_pipeline.run_errors import describe

    missing = FileNotFoundError(2, "No such file or directory")
    missing.filename = "data/05_model_input/test_tasks.parquet"
    try:
        try:
            raise missing
        except FileNotFoundError as cause:
            raise DatasetError(
                "test_tasks: Failed while loading data from dataset ParquetDataset(...)."
            ) from cause
    except DatasetError as error:
        message = describe(error)
    assert message is not None
    assert message.startswith(
        "input 'test_tasks' is missing: data/05_model_input/test_tasks.parquet does not exist"
    )


def test_an_input_in_neither_catalog_nor_parameters_is_one_line_and_other_errors_keep_the_traceback():
    from conductor_pipeline.run_errors import describe

    message = describe(ValueError("Pipeline input(s) {'params:x'} not found in the DataCatalog"))
    assert message is not None and "'params:x'" in message
    assert describe(ValueError("a bug in a node")) is None
    assert describe(KeyError("k")) is None


def test_python_m_conductor_pipeline_finds_the_projects_run_command():
    from kedro.framework.cli.utils import find_run_command

    from conductor_pipeline.run_errors import run

    assert find_run_command("conductor_pipeline") is run
