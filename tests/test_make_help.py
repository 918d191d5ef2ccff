"""`make help`: every target a user can call is listed with its one-line description, and
`make` alone still installs (the default goal is unchanged)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make not installed")


def _make(*args: str) -> str:
    done = subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _user_targets() -> set[str]:
    """The .PHONY targets that have a rule in the Makefile."""
    text = (REPO / "Makefile").read_text()
    phony = {
        name
        for line in re.findall(r"^\.PHONY:(.*)$", text, flags=re.M)
        for name in line.split()
        if not name.startswith("$")
    }
    return {name for name in phony if re.search(rf"^{re.escape(name)}:", text, flags=re.M)}


def test_help_lists_every_target_with_a_description():
    listed = {}
    for line in _make("help").splitlines():
        match = re.match(r"^\s+make (\S+)\s+(\S.*)$", line)
        assert match, f"not a 'make <target>  <description>' line: {line!r}"
        listed[match.group(1)] = match.group(2)
    assert {"install", "run", "test", "mlflow", "help"} <= set(listed)
    missing = _user_targets() - set(listed)
    assert not missing, f"targets without a `## description` on their line: {sorted(missing)}"


def test_make_alone_still_installs():
    database = _make("-pn", "help")  # prints make's database without running a recipe
    assert re.search(r"^\.DEFAULT_GOAL := install$", database, flags=re.M)
