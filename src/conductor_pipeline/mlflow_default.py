"""The project's MLflow store as the default of every Python started inside the project.

MLflow picks its tracking URI from ``mlflow.set_tracking_uri``, else ``MLFLOW_TRACKING_URI``,
else ``sqlite:///mlflow.db`` in the working directory; it offers no plugin hook for that
default. So a script or notebook that runs ``mlflow.pyfunc.load_model("models:/conductor@champion")``
without the Makefile's environment would open (and create) an empty ``./mlflow.db``.

``make install`` writes a ``.pth`` file into the environment's site-packages (Python runs its
``import`` line at start-up) that calls :func:`startup`: when ``MLFLOW_TRACKING_URI`` is unset
and the working directory is inside a conductor-pipeline project, it is set to that project's
``mlruns/mlflow.db``, exactly as the Makefile exports it. A URI the user set always wins, and
outside the project nothing changes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
from pathlib import Path

from conductor_pipeline.paths import enclosing_project, mlflow_tracking_uri

HOOK_FILE = "conductor_pipeline_mlflow.pth"
# one line: site.py executes .pth lines that start with "import"
HOOK_LINE = "import conductor_pipeline.mlflow_default as _hook; _hook.startup()\n"


def use_project_tracking_uri(cwd: Path | None = None) -> str | None:
    """Set ``MLFLOW_TRACKING_URI`` to the enclosing project's store when it is unset (no
    fallback to the checkout the package was installed from, unlike
    ``paths.find_project_root``: outside the project MLflow's own default stays); returns
    the URI set, or ``None`` when nothing changed (already set, or outside a project)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return None
    root = enclosing_project(cwd)
    if root is None:
        return None
    uri = mlflow_tracking_uri(root)
    os.environ["MLFLOW_TRACKING_URI"] = uri
    return uri


def startup() -> None:
    """The ``.pth`` hook: :func:`use_project_tracking_uri`, never failing the interpreter's
    start (a deleted working directory, an unreadable pyproject.toml)."""
    with contextlib.suppress(Exception):  # a start-up hook must not stop Python starting
        use_project_tracking_uri()


def install_hook(site_packages: Path | None = None) -> Path:
    """Write the ``.pth`` hook into ``site_packages`` (default: this interpreter's); returns
    its path. Idempotent."""
    folder = Path(site_packages or sysconfig.get_paths()["purelib"])
    hook = folder / HOOK_FILE
    if not hook.is_file() or hook.read_text() != HOOK_LINE:
        hook.write_text(HOOK_LINE)
    return hook


def main(argv: list[str] | None = None) -> int:
    """``python -m conductor_pipeline.mlflow_default install``: write the hook (make install)."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["install"]:
        print("usage: python -m conductor_pipeline.mlflow_default install", file=sys.stderr)
        return 2
    print(f"MLflow store default for Python inside the project: {install_hook()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
