"""Offline by default outside the Makefile too: `kedro run`, `kedro jupyter` and notebooks
import the project settings, and the `conductor` command its modules, which set the offline
variables; Kedro telemetry is refused by the project's `.telemetry` file even when no variable
is set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conductor_pipeline.offline import OFFLINE_DEFAULTS

ROOT = Path(__file__).resolve().parents[1]


def _bare_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_DEFAULTS}
    return env | extra


@pytest.mark.parametrize(
    "module",
    ["conductor_pipeline.settings", "conductor_pipeline.cli", "conductor_pipeline.commands"],
)
def test_project_entry_points_set_the_offline_variables_but_keep_the_users_choice(module):
    """The project settings (``kedro``, notebooks), the ``conductor`` command and its
    commands' module imported alone (a script calling a command)."""
    code = (
        "import json, os\n"
        f"import {module}\n"
        "from conductor_pipeline.offline import OFFLINE_DEFAULTS\n"
        "print(json.dumps({k: os.environ.get(k) for k in OFFLINE_DEFAULTS}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_bare_env(HF_HUB_OFFLINE="0"),
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == OFFLINE_DEFAULTS | {"HF_HUB_OFFLINE": "0"}


def test_kedro_telemetry_is_refused_by_the_project_file(monkeypatch):
    from kedro_telemetry.plugin import _check_for_telemetry_consent

    for name in ("KEDRO_DISABLE_TELEMETRY", "DO_NOT_TRACK"):
        monkeypatch.delenv(name, raising=False)
    assert (ROOT / ".telemetry").read_text().strip() == "consent: false"
    assert _check_for_telemetry_consent(ROOT) is False
