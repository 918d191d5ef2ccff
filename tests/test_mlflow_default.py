"""The registry from plain Python inside the project: `mlflow.pyfunc.load_model(
"models:/conductor@champion")` in a script or notebook, with no MLFLOW_TRACKING_URI set,
opens the project's mlruns/mlflow.db (the start-up hook `make install` writes) and leaves no
stray ./mlflow.db."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import mlflow
import pytest

import conductor_pipeline
from conductor_pipeline.mlflow_default import (
    HOOK_FILE,
    HOOK_LINE,
    install_hook,
    use_project_tracking_uri,
)
from conductor_pipeline.paths import enclosing_project

# the README's lines, as a user types them in a script or a notebook cell
README_LINES = """\
import mlflow
model = mlflow.pyfunc.load_model("models:/conductor@champion")
print(model.predict({"question": ["What is 2 + 2?"]}))
"""

ECHO_MODEL = """\
import mlflow
from mlflow.pyfunc import PythonModel


class Echo(PythonModel):
    def predict(self, context, model_input, params=None):
        return [f"echo: {q}" for q in model_input["question"]]


mlflow.models.set_model(Echo())
"""


def _project(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text('[tool.kedro]\npackage_name = "conductor_pipeline"\n')
    (root / "notebooks").mkdir()
    return root


def _register_champion(root: Path) -> None:
    """A registered `conductor` pyfunc model aliased `champion` in ``root``'s own store."""
    uri = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    (root / "mlruns").mkdir()
    code = root / "echo_model.py"
    code.write_text(ECHO_MODEL)
    mlflow.set_tracking_uri(uri)  # the autouse fixture restores the test store afterwards
    experiment = mlflow.create_experiment(
        "conductor", artifact_location=str(root / "mlruns" / "artifacts")
    )
    with mlflow.start_run(experiment_id=experiment):
        info = mlflow.pyfunc.log_model(
            name="conductor",
            python_model=str(code),
            pip_requirements=["mlflow"],
            registered_model_name="conductor",
        )
    mlflow.MlflowClient().set_registered_model_alias(
        "conductor", "champion", str(info.registered_model_version)
    )


def _plain_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("CONDUCTOR_PROJECT_ROOT", None)
    return env


def test_the_readme_lines_load_the_champion_from_the_project_and_a_subfolder(tmp_path):
    hook = Path(sysconfig.get_paths()["purelib"]) / HOOK_FILE
    assert hook.is_file(), f"{hook} is missing: run `make install` (it writes the hook)"
    root = _project(tmp_path / "project")
    _register_champion(root)
    for cwd in (root, root / "notebooks"):
        done = subprocess.run(
            [sys.executable, "-c", README_LINES],
            cwd=cwd,
            env=_plain_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        assert "echo: What is 2 + 2?" in done.stdout
        assert not (cwd / "mlflow.db").exists(), f"a stray store in {cwd}"


def test_the_hook_file_sets_the_uri_inside_a_project_only(tmp_path):
    """The .pth line itself, through site.addsitedir (what Python does with site-packages)."""
    (tmp_path / "site").mkdir()
    site = install_hook(tmp_path / "site")
    assert site.read_text() == HOOK_LINE
    assert install_hook(tmp_path / "site") == site  # idempotent
    root = _project(tmp_path / "project")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    probe = (
        f"import site; site.addsitedir({str(tmp_path / 'site')!r}); "
        "import os; print(os.environ.get('MLFLOW_TRACKING_URI'))"
    )
    # -S: without the site-packages (and the hook installed there); the package from src/
    env = {**_plain_env(), "PYTHONPATH": str(Path(conductor_pipeline.__file__).parents[1])}
    runs = {}
    for cwd in (root / "notebooks", outside):
        done = subprocess.run(
            [sys.executable, "-S", "-c", probe],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        runs[cwd] = done.stdout.strip()
    assert runs[root / "notebooks"] == f"sqlite:///{root.resolve() / 'mlruns' / 'mlflow.db'}"
    assert runs[outside] == "None"


def test_a_uri_already_set_wins(monkeypatch, tmp_path):
    root = _project(tmp_path / "project")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert use_project_tracking_uri(root) is None
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.delenv("CONDUCTOR_PROJECT_ROOT", raising=False)
    assert use_project_tracking_uri(root / "notebooks") == (
        f"sqlite:///{root.resolve() / 'mlruns' / 'mlflow.db'}"
    )
    assert os.environ["MLFLOW_TRACKING_URI"].endswith("/project/mlruns/mlflow.db")


@pytest.mark.parametrize("override", [True, False])
def test_enclosing_project(monkeypatch, tmp_path, override):
    root = _project(tmp_path / "project")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    if override:
        monkeypatch.setenv("CONDUCTOR_PROJECT_ROOT", str(root))
        assert enclosing_project(outside) == root.resolve()
    else:
        monkeypatch.delenv("CONDUCTOR_PROJECT_ROOT", raising=False)
        # no fallback to the checkout the package was installed from
        assert enclosing_project(outside) is None
        assert enclosing_project(root / "notebooks") == root.resolve()
