"""Execute a report notebook with papermill and render it to HTML without the code.

A report is a thin notebook in ``notebooks/``: a cell tagged ``parameters`` (paths, run ids,
the tracking URI), then calls into :mod:`conductor_pipeline.reporting`. The kernel never
opens a Kedro session; everything it needs arrives as parameters.

When a cell raises, :class:`ReportFailed` says which cell and what error, and the partly
executed notebook is kept next to the HTML as ``<name>.failed.ipynb`` (outputs up to the
failing cell), so the failure can be read in Jupyter.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_KERNEL = "python3"


class ReportFailed(RuntimeError):
    """A report notebook raised; the message names the cell and its error."""

    def __init__(self, message: str, *, partial_notebook: Path | None = None):
        super().__init__(message)
        self.partial_notebook = partial_notebook


@dataclass(frozen=True)
class ReportResult:
    html_path: Path
    notebook_path: Path
    seconds: float
    html: str


def check_kernel(kernel_name: str = DEFAULT_KERNEL) -> None:
    """Fail early, with the fix, when ``kernel_name`` is missing or would start another
    interpreter than this one (which could not import the project package)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(kernel_name)
    except NoSuchKernel as err:
        raise ReportFailed(
            f"no Jupyter kernel named {kernel_name!r}; install one into this environment with "
            f"`{sys.executable} -m ipykernel install --sys-prefix --name {kernel_name}` "
            "(or set reporting.kernel_name to an installed one: `jupyter kernelspec list`)"
        ) from err
    program = spec.argv[0] if spec.argv else ""
    interpreters = {"python", "python3", f"python3.{sys.version_info[1]}", sys.executable}
    if program not in interpreters and os.path.realpath(program) != os.path.realpath(
        sys.executable
    ):
        raise ReportFailed(
            f"Jupyter kernel {kernel_name!r} ({spec.resource_dir}) starts {program}, not this "
            f"environment's {sys.executable}, and would not find conductor_pipeline; install a "
            f"kernel for it with `{sys.executable} -m ipykernel install --sys-prefix --name "
            "conductor-pipeline` and set reporting.kernel_name: conductor-pipeline"
        )


def ipc_kernel_manager(folder: str | Path) -> type:
    """A kernel manager class whose kernels talk over Unix sockets in ``folder``.

    Over TCP (the default) every kernel logs "Kernel is running over TCP without
    encryption" into the run's log; local IPC sockets in a private folder carry no such
    risk and so no warning. ``folder`` must have a short path (a socket path has at most
    ~100 characters)."""
    from jupyter_client.manager import AsyncKernelManager

    prefix = str(Path(folder) / "kernel")

    class IPCKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs: Any) -> None:
            kwargs.setdefault("transport", "ipc")
            kwargs.setdefault("ip", prefix)
            super().__init__(**kwargs)

    return IPCKernelManager


def _describe_failure(err: Exception) -> str:
    """``cell N: <ename>: <evalue>`` from papermill's error (or the exception itself)."""
    from papermill.exceptions import PapermillExecutionError

    if isinstance(err, PapermillExecutionError):
        source = (err.source or "").strip().splitlines()
        first = source[0][:120] if source else ""
        where = f"cell {err.cell_index}" + (f" (`{first}`)" if first else "")
        return f"{where}: {err.ename}: {err.evalue}"
    return f"{type(err).__name__}: {err}"


def notebook_to_html(notebook_path: str | Path) -> str:
    """The executed notebook as a standalone HTML page without input cells or prompts;
    figures stay embedded as base64 PNG ``<img>`` tags."""
    import nbformat
    from nbconvert import HTMLExporter

    notebook = nbformat.read(str(notebook_path), as_version=4)
    exporter = HTMLExporter(
        exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True
    )
    body, _ = exporter.from_notebook_node(notebook)
    return body


_SQLITE = "sqlite:///"


def _relative_to(path: str | Path, base: Path) -> str:
    """``path`` relative to ``base`` when it lies in the project, else as given."""
    from conductor_pipeline.paths import project_root

    path = str(path)
    if not path.startswith("/"):
        return path
    try:
        root = project_root()
    except RuntimeError:  # outside any project: nothing to keep portable
        return path
    if not Path(path).resolve().is_relative_to(root):
        return path
    return os.path.relpath(Path(path).resolve(), base.resolve())


def portable_parameters(parameters: dict[str, Any], cwd: Path) -> dict[str, Any]:
    """``parameters`` with each absolute path (or ``sqlite:///`` URI) inside the project made
    relative to ``cwd``, the kernel's working directory, where the notebook opens them."""
    portable: dict[str, Any] = {}
    for key, value in parameters.items():
        if isinstance(value, str) and value.startswith(_SQLITE + "/"):
            value = _SQLITE + _relative_to(value.removeprefix(_SQLITE), cwd)
        elif isinstance(value, str):
            value = _relative_to(value, cwd)
        portable[key] = value
    return portable


def execute_report(
    template: str | Path,
    output_dir: str | Path,
    parameters: dict[str, Any],
    *,
    name: str | None = None,
    kernel_name: str = DEFAULT_KERNEL,
    cwd: str | Path | None = None,
    timeout_s: float | None = 600,
    write_html: bool = True,
) -> ReportResult:
    """Run ``template`` with ``parameters``; keep the executed notebook as
    ``<output_dir>/<name>.ipynb`` and (with ``write_html``) the page as ``<name>.html``.
    ``name`` defaults to the template's stem; the HTML is also in the result.

    On failure the partial notebook is kept as ``<name>.failed.ipynb`` and
    :class:`ReportFailed` is raised with the failing cell's error; a stale ``.failed.ipynb``
    of an earlier run is removed on success.
    """
    import papermill as pm

    template = Path(template)
    if not template.is_file():
        raise ReportFailed(f"report notebook {template} not found")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    name = name or template.stem
    html_path = output_dir / f"{name}.html"
    executed = output_dir / f"{name}.ipynb"
    failed = output_dir / f"{name}.failed.ipynb"
    check_kernel(kernel_name)

    started = time.perf_counter()
    sockets = tempfile.mkdtemp(prefix="report-kernel-")  # private (0700), short path
    try:
        # relative paths: papermill records the parameters and both paths in the executed
        # notebook, which must not name the folder of a moved project
        pm.execute_notebook(
            _relative_to(template, Path.cwd()),
            _relative_to(executed, Path.cwd()),
            parameters=portable_parameters(parameters, Path(cwd) if cwd else Path.cwd()),
            kernel_name=kernel_name,
            cwd=str(cwd) if cwd else None,
            progress_bar=False,
            execution_timeout=timeout_s,
            kernel_manager_class=ipc_kernel_manager(sockets),
        )
    except Exception as err:
        kept = None
        if executed.is_file():
            shutil.move(executed, failed)
            kept = failed
        message = f"report {template.name} failed in {_describe_failure(err)}"
        if kept is not None:
            message += f" (partial notebook kept at {kept})"
        raise ReportFailed(message, partial_notebook=kept) from err
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    seconds = time.perf_counter() - started
    html = notebook_to_html(executed)
    if write_html:
        html_path.write_text(html, encoding="utf-8")
    failed.unlink(missing_ok=True)
    logger.info("report %s rendered in %.1f s -> %s", template.name, seconds, html_path)
    return ReportResult(html_path=html_path, notebook_path=executed, seconds=seconds, html=html)
