"""The committed Airflow DAG of the retraining pipeline compiles, has no cycle, runs every
node of the pipeline exactly once, and (where kedro-airflow is installed) is what
`airflow/generate_dag.sh` produces today. Airflow itself is not needed."""

from __future__ import annotations

import ast
import importlib.util
import os
import py_compile
import re
import shutil
import subprocess
from graphlib import CycleError, TopologicalSorter

import pytest

from tests.reporting.conftest import REPO

DAG = REPO / "airflow" / "dags" / "conductor_pipeline_retraining_dag.py"


def _tasks_and_edges(source: str) -> tuple[dict[str, list[str]], list[tuple[str, str]]]:
    tasks: dict[str, list[str]] = {}
    for match in re.finditer(
        r'@task\(task_id="([^"]+)"\)\n\s+def \w+\(\):\n\s+_run_kedro_node\(node_names=(\[.*?\])\)',
        source,
    ):
        tasks[match.group(1)] = ast.literal_eval(match.group(2))
    edges = re.findall(r'tasks\["([^"]+)"\] >> tasks\["([^"]+)"\]', source)
    return tasks, edges


def test_the_committed_dag_compiles(tmp_path):
    assert DAG.is_file(), "generate it with airflow/generate_dag.sh"
    py_compile.compile(str(DAG), cfile=str(tmp_path / "dag.pyc"), doraise=True)


def test_the_dag_runs_each_retraining_node_once_in_an_acyclic_order():
    from conductor_pipeline.pipeline_registry import register_pipelines

    tasks, edges = _tasks_and_edges(DAG.read_text())
    nodes = [name for names in tasks.values() for name in names]
    expected = {n.name for n in register_pipelines()["retraining"].nodes}
    assert sorted(nodes) == sorted(expected), "stale DAG: regenerate with airflow/generate_dag.sh"
    graph: dict[str, set[str]] = {task: set() for task in tasks}
    for parent, child in edges:
        graph[child].add(parent)
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as err:
        pytest.fail(f"the DAG has a cycle (an in-memory dataset joins tasks): {err.args[1]}")
    first = next(t for t in order if "acquire_retraining_lock" in tasks[t])
    last = next(t for t in order if "release_retraining_lock" in tasks[t])
    assert order.index(first) < order.index(last)
    assert graph[last], "releasing the lock must wait for the rest of the run"


@pytest.mark.skipif(
    importlib.util.find_spec("kedro_airflow") is None,
    reason="kedro-airflow is in the optional `airflow` extra",
)
def test_the_committed_dag_is_what_generate_dag_produces(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(REPO / "airflow", project / "airflow", ignore=shutil.ignore_patterns("dags"))
    shutil.copytree(REPO / "conf", project / "conf", ignore=shutil.ignore_patterns("local"))
    (project / "conf" / "local").mkdir()
    shutil.copy(REPO / "pyproject.toml", project)
    (project / "src").mkdir()  # the package itself is installed
    kedro = shutil.which("kedro") or str(REPO / ".venv" / "bin" / "kedro")
    subprocess.run(
        ["bash", "airflow/generate_dag.sh"],
        cwd=project,
        env={**os.environ, "KEDRO": kedro, "CONDUCTOR_PROJECT_ROOT": str(project)},
        check=True,
        capture_output=True,
        text=True,
    )
    generated = (project / "airflow" / "dags" / DAG.name).read_text()
    assert generated == DAG.read_text(), "stale DAG: regenerate with airflow/generate_dag.sh"
