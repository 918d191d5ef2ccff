"""The registered ``conductor`` pyfunc model, as a user's script meets it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_defining_the_model_class_warns_nothing():
    """MLflow inspects ``predict``'s input annotation when the class is defined (so on every
    ``mlflow.pyfunc.load_model``): ``Any`` printed a red warning above the README's three
    lines, no annotation a yellow one. A fresh interpreter, every warning shown."""
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "always",
            "-c",
            "import conductor_pipeline.pipelines.training.mlflow_model",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "type hint" not in done.stderr.lower(), done.stderr
