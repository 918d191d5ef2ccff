"""`kedro jupyter lab` and `kedro viz` get as far as they can without starting a server:
the install line brings in their packages, the project kernel is registered and loads the
project, and kedro-viz builds its static site offline."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
KEDRO = [sys.executable, "-m", "kedro"]
EXPLORE = REPO / "notebooks" / "explore_conductor.ipynb"


def _project(root: Path) -> Path:
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copytree(REPO / "conf", root / "conf", ignore=shutil.ignore_patterns("local"))
    (root / "conf" / "local").mkdir()
    (root / "src").mkdir()
    return root


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("CONDUCTOR_PROJECT_ROOT", None)
    # kernel specs go to a throw-away Jupyter data folder, not the user's
    env["JUPYTER_DATA_DIR"] = str(tmp_path / "jupyter-data")
    env["JUPYTER_PATH"] = str(tmp_path / "jupyter-data")
    env["KEDRO_DISABLE_TELEMETRY"] = "true"
    return env


INSTALL = r'pip install --quiet[^"\n]* -e "\.\[([^\]]+)\]"'  # the project with its extras


def _under_make(tmp_path: Path, command: str, **env: str) -> str:
    """What ``command`` prints when run as a recipe of the project's Makefile (its exported
    settings applied), with ``env`` in the caller's environment. The caller's
    ``PYTHONWARNINGS`` is left out: under ``make test`` it is the Makefile's own, which the
    recipe would then inherit whether or not the Makefile still sets it."""
    probe = tmp_path / "probe.mk"
    probe.write_text(f"include {REPO / 'Makefile'}\nprobe:\n\t@{command}\n")
    caller = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "-f", str(probe), "probe"],
        cwd=REPO,
        env={**caller, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")
def test_make_writes_bytecode_on_first_import_without_installed_code_warnings(tmp_path):
    """No package is compiled up front (pip installs without, nothing follows): under make, a
    module's bytecode is written the first time a process imports it, also where the
    machine sets PYTHONDONTWRITEBYTECODE (every process would compile torch, transformers and
    the rest again), and the compiler's SyntaxWarning about installed code (cellpylib's
    `is "recursive"`) is not printed."""
    makefile = (REPO / "Makefile").read_text()
    lines = makefile.splitlines()
    installs = [i for i in lines if "pip install" in i and ("-e " in i or "torch==" in i)]
    assert len(installs) == 3 and all("--no-compile" in line for line in installs)
    assert "compileall" not in makefile

    package = tmp_path / "site" / "pkg"
    package.mkdir(parents=True)
    (package / "mod.py").write_text('def f(memoize):\n    return memoize is "recursive"\n')
    script = f"import sys; sys.path.insert(0, {str(package.parent)!r}); import pkg.mod"
    printed = _under_make(tmp_path, f'{sys.executable} -c "{script}"', PYTHONDONTWRITEBYTECODE="1")
    assert printed == ""
    assert list((package / "__pycache__").glob("mod.*.pyc"))
    # without the Makefile's settings the same import writes nothing and warns
    for written in (package / "__pycache__").iterdir():
        written.unlink()
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONWARNINGS": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "SyntaxWarning" in done.stderr and not list((package / "__pycache__").glob("*.pyc"))


def test_make_test_notebooks_and_viz_bring_in_the_notebooks_extra_and_make_run_does_not():
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^\$\(NOTEBOOKS_STAMP\): \$\(STAMP\)\n((?:\t[^\n]*\n)+)", makefile, re.M)
    assert recipe, "no rule for the notebooks stamp"
    install = re.search(INSTALL, recipe.group(1))
    assert install and "notebooks" in install.group(1).split(","), "the rule lacks notebooks"
    for target in ("test", "test-fast", "notebooks", "viz"):
        assert re.search(rf"^{target}: \$\(NOTEBOOKS_STAMP\)", makefile, re.M), target
    assert re.search(r"^run: \$\(STAMP\)", makefile, re.M)
    base = re.search(r"^\$\(STAMP\): [^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.M)
    assert base
    assert re.findall(INSTALL, base.group(1)) == ["test"]
    assert re.search(
        r"^notebooks: \$\(NOTEBOOKS_STAMP\)[^\n]*\n\t\$\(BIN\)/kedro jupyter lab", makefile, re.M
    )
    import tomllib

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["notebooks"]
    assert any(req.startswith("jupyterlab") for req in extra)
    assert any(req.startswith("kedro-viz") for req in extra)


def test_kedro_jupyter_setup_registers_a_kernel_that_loads_the_project(tmp_path):
    root = _project(tmp_path / "project")
    env = _env(tmp_path)
    done = subprocess.run(
        [*KEDRO, "jupyter", "setup"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    spec = json.loads(
        (tmp_path / "jupyter-data/kernels/kedro_conductor_pipeline/kernel.json").read_text()
    )
    assert spec["argv"][-2:] == ["--ext", "kedro.ipython"]
    # the exploration notebook opens on that kernel, the only one Kedro registered
    (registered,) = (tmp_path / "jupyter-data/kernels").iterdir()
    kernelspec = json.loads(EXPLORE.read_text())["metadata"]["kernelspec"]
    assert kernelspec["name"] == registered.name
    assert kernelspec["display_name"] == spec["display_name"]

    # the registered kernel, started as JupyterLab starts it, has the project loaded
    from jupyter_client.manager import start_new_kernel

    os.environ.update({k: env[k] for k in ("JUPYTER_DATA_DIR", "JUPYTER_PATH")})
    try:
        manager, client = start_new_kernel(
            kernel_name="kedro_conductor_pipeline", cwd=str(root), env=env, startup_timeout=120
        )
        try:
            outputs: list[str] = []

            def keep(message: dict) -> None:
                if message["header"]["msg_type"] == "stream":
                    outputs.append(message["content"]["text"])

            reply = client.execute_interactive(
                "print(sorted(pipelines)); print(context.project_path)",
                timeout=120,
                output_hook=keep,
            )
            assert reply["content"]["status"] == "ok", reply["content"]
            text = "".join(outputs)
            assert "'training'" in text and str(root) in text, text
        finally:
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    finally:
        for key in ("JUPYTER_DATA_DIR", "JUPYTER_PATH"):
            os.environ.pop(key, None)


def _outputs(client, code: str) -> list[str]:
    """What ``code`` shows in the notebook: streams, displays (rich log lines are displays)
    and errors."""
    shown: list[str] = []

    def keep(message: dict) -> None:
        kind, content = message["header"]["msg_type"], message["content"]
        if kind == "stream":
            shown.append(content["text"])
        elif kind in ("display_data", "execute_result"):
            shown.append(str(content["data"].get("text/plain", content["data"])))
        elif kind == "error":
            shown.append(f"{content['ename']}: {content['evalue']}")

    reply = client.execute_interactive(code, timeout=180, output_hook=keep)
    assert reply["content"]["status"] == "ok", (reply["content"], shown)
    return shown


def test_the_notebook_loads_the_project_quietly_in_a_plain_kernel(tmp_path):
    """Papermill's or an editor's kernel, started without the Makefile's logging variables:
    the notebook's own loading cell shows no log line and no TqdmWarning."""
    from jupyter_client.manager import start_new_kernel

    root = _project(tmp_path / "project")
    (root / "notebooks").mkdir()
    env = _env(tmp_path)
    # the MLflow store `make run` leaves (a new one is announced by MLflow, once)
    (root / "mlruns").mkdir()
    store = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    make_store = f"import mlflow; mlflow.MlflowClient({store!r}).search_experiments()"
    subprocess.run(
        [sys.executable, "-c", make_store], cwd=root, env=env, check=True, capture_output=True
    )
    for name in ("KEDRO_LOGGING_CONFIG", "KEDRO_LOGGING_MODULE_ALLOWLIST"):
        env.pop(name, None)
    cells = json.loads(EXPLORE.read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    (load,) = [source for source in code if "%load_ext kedro.ipython" in source]
    manager, client = start_new_kernel(
        kernel_name="python3", cwd=str(root / "notebooks"), env=env, startup_timeout=120
    )
    try:
        shown = _outputs(client, load)
        assert shown == [], "".join(shown)
        text = "".join(_outputs(client, "print(sorted(pipelines)); print(context.project_path)"))
        assert "'training'" in text and str(root) in text, text
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_use_project_logging_keeps_a_chosen_file_and_allows_the_filter(tmp_path, monkeypatch):
    from conductor_pipeline.notebook_logging import FILTER_MODULE, use_project_logging

    # set, then removed: monkeypatch records an unset variable only so, and the value
    # use_project_logging sets would outlive the test (the Kedro subprocesses of later tests
    # would read a logging file whose filter they are not allowed to load)
    monkeypatch.setenv("KEDRO_LOGGING_CONFIG", "")
    monkeypatch.delenv("KEDRO_LOGGING_CONFIG")
    monkeypatch.setenv("KEDRO_LOGGING_MODULE_ALLOWLIST", "my_filters")
    # where an earlier test imported Kedro in this process, the file is applied at once
    (tmp_path / "conf/base").mkdir(parents=True)
    shutil.copy(REPO / "conf/base/logging.yml", tmp_path / "conf/base/logging.yml")
    assert use_project_logging(tmp_path) == tmp_path / "conf/base/logging.yml"
    assert os.environ["KEDRO_LOGGING_MODULE_ALLOWLIST"] == f"my_filters,{FILTER_MODULE}"
    # Kedro is imported in this process already: the file is applied at once
    chosen = tmp_path / "mine.yml"
    chosen.write_text(
        "version: 1\ndisable_existing_loggers: false\nloggers: {probe: {level: ERROR}}\n"
    )
    monkeypatch.setenv("KEDRO_LOGGING_CONFIG", str(chosen))
    import kedro.framework.project  # noqa: F401

    try:
        assert use_project_logging(tmp_path) == chosen
        assert logging.getLogger("probe").level == logging.ERROR
        assert os.environ["KEDRO_LOGGING_MODULE_ALLOWLIST"].count(FILTER_MODULE) == 1
    finally:
        logging.getLogger("probe").setLevel(logging.NOTSET)


@pytest.mark.skipif(
    importlib.util.find_spec("jupyterlab") is None, reason="notebooks extra not installed"
)
def test_kedro_jupyter_lab_gets_past_its_checks(tmp_path):
    # `--help` is forwarded to `jupyter lab` after Kedro's own checks (the module check that
    # printed only "NoneType: None" when jupyterlab was missing) and kernel registration
    root = _project(tmp_path / "project")
    done = subprocess.run(
        [*KEDRO, "jupyter", "lab", "--help"],
        cwd=root,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NoneType: None" not in done.stdout + done.stderr
    assert (tmp_path / "jupyter-data/kernels/kedro_conductor_pipeline/kernel.json").is_file()


@pytest.mark.skipif(
    importlib.util.find_spec("kedro_viz") is None, reason="notebooks extra not installed"
)
def test_kedro_viz_builds_the_pipeline_site_offline(tmp_path):
    root = _project(tmp_path / "project")
    done = subprocess.run(
        [*KEDRO, "viz", "build"],
        cwd=root,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    main = json.loads((root / "build/api/main").read_text())
    node_names = {node["name"] for node in main["nodes"]}
    assert any("register" in name.lower() for name in node_names), sorted(node_names)[:20]
