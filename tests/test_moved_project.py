"""A moved or copied project shows no path of its old folder: ``make`` makes a ``.venv`` of
another folder again, and nothing the pipeline stores under ``data/`` and ``mlruns/`` (tags,
adapter configs and model cards, executed report notebooks, run info) names the old root."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conductor_pipeline.paths import project_relative

REPO = Path(__file__).resolve().parents[1]


# -- make: a .venv made for another folder -----------------------------------------------------


def _project_with_venv(root: Path, made_for: str) -> Path:
    """A project at ``root`` whose installed ``.venv`` (stamp newer than the Makefile) says,
    as ``python -m venv`` writes it, that it was made for ``made_for``."""
    (root / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(REPO / "Makefile", root)
    shutil.copy(REPO / "pyproject.toml", root)
    (root / ".venv" / "bin" / "activate").write_text(
        f'# This file must be used with "source bin/activate"\nVIRTUAL_ENV="{made_for}"\nexport VIRTUAL_ENV\n'
    )
    (root / ".venv" / ".installed").touch()
    return root


def _make_dry_run(root: Path) -> str:
    done = subprocess.run(
        ["make", "-n", "install"], cwd=root, capture_output=True, text=True, check=True
    )
    return done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")
def test_make_rebuilds_a_venv_made_for_another_folder(tmp_path):
    root = _project_with_venv(tmp_path / "new", "/old/place/.venv")
    plan = _make_dry_run(root)
    assert "was made for /old/place/.venv" in plan, plan
    assert "rm -rf .venv" in plan
    assert "-m venv .venv" in plan

    # the same .venv where it was made: nothing to do
    (root / ".venv" / "bin" / "activate").write_text(
        f"VIRTUAL_ENV='{root.resolve()}/.venv'\nexport VIRTUAL_ENV\n"
    )
    assert "Nothing to be done" in _make_dry_run(root)


# -- unit: project-relative paths --------------------------------------------------------------


def test_project_relative_keeps_outside_paths(tmp_path):
    root = tmp_path / "p"
    (root / "data").mkdir(parents=True)
    assert project_relative(root / "data" / "x.json", root) == "data/x.json"
    assert project_relative(str(root), root) == "."
    assert project_relative("/opt/models/base", root) == "/opt/models/base"
    assert project_relative("data/x.json", root) == "data/x.json"
