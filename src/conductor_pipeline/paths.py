"""Where the project lives, so that every entry point hits the same data and MLflow store.

Kedro runs from the project root, notebooks from ``notebooks/``, tests from a temporary
copy; a path relative to the working directory would give each its own ``mlruns/``.
"""

from __future__ import annotations

import os
import tomllib
from functools import cache
from pathlib import Path

_PACKAGE = "conductor_pipeline"


def _is_project_root(candidate: Path) -> bool:
    pyproject = candidate / "pyproject.toml"
    if not pyproject.is_file():
        return False
    try:
        kedro_table = tomllib.loads(pyproject.read_text()).get("tool", {}).get("kedro", {})
    except (OSError, tomllib.TOMLDecodeError):
        return False
    return kedro_table.get("package_name") == _PACKAGE


def enclosing_project(start: Path | None = None) -> Path | None:
    """The nearest directory at or above ``start`` (default: the working directory) that
    holds this project's ``pyproject.toml``; ``CONDUCTOR_PROJECT_ROOT`` wins when set;
    ``None`` outside any project."""
    override = os.environ.get("CONDUCTOR_PROJECT_ROOT")
    if override:
        return Path(override).resolve()
    origin = (start or Path.cwd()).resolve()
    for candidate in (origin, *origin.parents):
        if _is_project_root(candidate):
            return candidate
    return None


def find_project_root(start: Path | None = None) -> Path:
    """:func:`enclosing_project`, falling back to the checkout this package was installed
    from (editable installs)."""
    for origin in (start, Path(__file__)):  # None: the working directory
        found = enclosing_project(origin)
        if found is not None:
            return found
    raise RuntimeError(
        "Cannot find the conductor-pipeline project root (a pyproject.toml with "
        "[tool.kedro] package_name = 'conductor_pipeline'); run from inside the project "
        "or set CONDUCTOR_PROJECT_ROOT."
    )


@cache
def _root_for(cwd: str, root_variable: str | None) -> Path:
    return find_project_root(Path(cwd))


def project_root() -> Path:
    """``find_project_root()`` for the current working directory, memoised per directory and
    value of ``CONDUCTOR_PROJECT_ROOT`` (a root set for a while must not outlive its setting)."""
    return _root_for(os.getcwd(), os.environ.get("CONDUCTOR_PROJECT_ROOT"))


def mlflow_tracking_uri(root: Path | None = None) -> str:
    """The absolute SQLite URI of the project's tracking and registry store."""
    return f"sqlite:///{(root or project_root()) / 'mlruns' / 'mlflow.db'}"


def reroot(location: str, root: Path, marker: str) -> str | None:
    """``location`` (an absolute path or ``file://`` URI) moved under ``root``, when it points
    into a ``<old root>/<marker>/...`` tree of another checkout; ``None`` when it needs no
    change (not a local path, no ``marker`` folder in it, or already under ``root``).

    A project that is moved or cloned keeps its ``mlruns/`` and ``data/`` trees, but the
    MLflow store and adapter configs recorded the old absolute paths; re-rooting them at the
    last ``/<marker>/`` keeps each reference inside the copy it belongs to.
    """
    scheme = ""
    path = location
    if location.startswith("file://"):
        scheme, path = "file://", location[len("file://") :]
    if not path.startswith("/"):
        return None
    cut = path.rfind(f"/{marker}/")
    if cut < 0 and path.endswith(f"/{marker}"):
        cut = len(path) - len(marker) - 1
    if cut < 0:
        return None
    old_root, rest = path[:cut], path[cut + 1 :]
    new_root = root.resolve().as_posix()
    if old_root == new_root:
        return None
    return f"{scheme}{new_root}/{rest}"


def project_relative(path: str | Path, root: Path | None = None) -> str:
    """``path`` relative to the project root (default: the current project) when it lies
    inside it, else as given. What the project stores (run info, tags, adapter configs)
    names its own files this way, so a moved or copied project does not point back into
    its old folder; relative paths resolve against the project root."""
    candidate = Path(path)
    if not candidate.is_absolute():
        return str(path)
    root = (root or project_root()).resolve()
    resolved = candidate.resolve()
    if not resolved.is_relative_to(root):
        return str(path)
    return resolved.relative_to(root).as_posix()
