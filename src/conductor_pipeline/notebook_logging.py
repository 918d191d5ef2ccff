"""The project's logging in a notebook kernel, so that ``%load_ext kedro.ipython`` is quiet.

Kedro configures logging once, when ``kedro.framework.project`` is first imported, from
``KEDRO_LOGGING_CONFIG`` or else ``conf/logging.yml`` *relative to the working directory*.
A kernel's working directory is ``notebooks/``, and only a kernel started under the
Makefile (``make notebooks``) inherits ``KEDRO_LOGGING_CONFIG``: any other kernel
(papermill, an editor's, ``jupyter lab`` started by hand) falls back to Kedro's default, with
neither the project's filter of known noise nor its quieter Kedro loggers.
:func:`use_project_logging` points Kedro at ``conf/base/logging.yml`` first.
"""

from __future__ import annotations

import logging.config
import os
import sys
from pathlib import Path

__all__ = ["FILTER_MODULE", "LOGGING_FILE", "use_project_logging"]

LOGGING_FILE = Path("conf") / "base" / "logging.yml"
# the module of the filter class logging.yml names, which Kedro must be allowed to load
FILTER_MODULE = "conductor_pipeline.log_filters"


def use_project_logging(root: Path | None = None) -> Path:
    """Make Kedro use the project's logging file (``root``: the project, found from the
    working directory by default); returns the file in use. A ``KEDRO_LOGGING_CONFIG``
    already set is kept. When Kedro has configured its logging already, the file is
    applied now."""
    if root is None:
        from conductor_pipeline.paths import project_root

        root = project_root()
    os.environ.setdefault("KEDRO_LOGGING_CONFIG", str(root / LOGGING_FILE))
    allowed = [m.strip() for m in os.environ.get("KEDRO_LOGGING_MODULE_ALLOWLIST", "").split(",")]
    if FILTER_MODULE not in allowed:
        os.environ["KEDRO_LOGGING_MODULE_ALLOWLIST"] = ",".join(
            [*filter(None, allowed), FILTER_MODULE]
        )
    path = Path(os.environ["KEDRO_LOGGING_CONFIG"])
    if "kedro.framework.project" in sys.modules:  # too late for Kedro to read the variable
        import yaml

        logging.config.dictConfig(yaml.safe_load(path.read_text(encoding="utf-8")))
    return path
