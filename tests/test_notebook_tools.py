"""`kedro jupyter lab` and `kedro viz` get as far as they can without starting a server:
the install line brings in their packages, the project kernel is registered and loads the
project, and kedro-viz builds its static site offline."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
KEDRO = [sys.executable, "-m", "kedro"]


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


def test_make_install_brings_in_the_notebooks_extra():
    makefile = (REPO / "Makefile").read_text()
    install = re.search(r'pip install --quiet -e "\.\[([^\]]+)\]"', makefile)
    assert install and "notebooks" in install.group(1).split(","), "make install lacks notebooks"
    assert re.search(r"^notebooks: \$\(STAMP\)\n\t\$\(BIN\)/kedro jupyter lab", makefile, re.M)
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
