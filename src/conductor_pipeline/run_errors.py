"""The project's ``kedro run``: Kedro's own command, with the checks of
:mod:`~conductor_pipeline.run_checks` first and one-line errors.

Kedro lets a project's ``cli.py`` replace a built-in command (built-in < plugins <
cli.py; ``find_run_command`` also takes ``run`` from there for ``python -m
conductor_pipeline``). This command takes every option of Kedro's ``run`` and adds
``--verbose``/``-v``, Kedro's flag for "show the full exception".

A wrong pipeline name, a parameter that is unknown, missing or fails its validation, a
missing configuration environment or input file, stop the run with one line
``error: <what is wrong>; <the fix>`` and exit status 1; ``--verbose`` prints the
traceback above it. Any other error keeps Kedro's traceback.
"""

from __future__ import annotations

import re
import sys
import traceback
from pathlib import Path
from typing import IO, Any

import click
from kedro.framework.cli.project import run as kedro_run
from kedro.framework.cli.utils import KedroCliError

from conductor_pipeline.run_checks import RunCheckFailed, check_run

__all__ = ["RunFailed", "describe", "run"]


class RunFailed(click.ClickException):
    """A run stopped with a one-line message; ``verbose`` also prints ``cause``'s traceback."""

    def __init__(self, message: str, cause: BaseException, verbose: bool) -> None:
        super().__init__(message)
        self.cause = cause
        self.verbose = verbose

    def show(self, file: IO[Any] | None = None) -> None:
        stream = file or sys.stderr
        if self.verbose:
            click.echo("".join(traceback.format_exception(self.cause)).rstrip(), file=stream)
        click.echo(f"error: {self.message}", file=stream)


def _causes(error: BaseException) -> list[BaseException]:
    chain, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        chain.append(current)
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return chain


_MISSING_INPUTS = re.compile(r"Pipeline input\(s\) \{(.*)\} not found in the \w+")
_DATASET_NAME = re.compile(r"^([\w.:-]+): Failed while loading data")


def describe(error: BaseException) -> str | None:
    """The one-line message for an error this command knows (None: keep the traceback)."""
    from kedro.config import MissingConfigException
    from kedro.io import DatasetError

    chain = _causes(error)
    for link in chain:
        if isinstance(link, RunCheckFailed):
            return str(link)
    if isinstance(error, MissingConfigException):
        return f"{error} (conf/ holds base, local and one folder per environment)"
    if isinstance(error, DatasetError):
        missing = next((c for c in chain if isinstance(c, FileNotFoundError)), None)
        if missing is not None:
            found = _DATASET_NAME.match(str(error))
            name = f"input '{found.group(1)}'" if found else "a dataset"
            path = missing.filename or str(missing)
            return (
                f"{name} is missing: {path} does not exist; run the pipeline that writes it "
                "first (kedro registry describe <pipeline> lists its outputs)"
            )
    if isinstance(error, ValueError):
        found = _MISSING_INPUTS.search(str(error))
        if found:
            return (
                f"no catalog entry or parameter for {found.group(1)}; add it to "
                "conf/base/catalog*.yml or conf/base/parameters*.yml"
            )
    return None


def _project_path() -> Path:
    from kedro.utils import find_kedro_project

    metadata = click.get_current_context().obj
    path = getattr(metadata, "project_path", None)
    return Path(path) if path else find_kedro_project(Path.cwd()) or Path.cwd()


def _run(verbose: bool, **options: Any) -> Any:
    if verbose:
        KedroCliError.VERBOSE_ERROR = True  # Kedro's own errors print their traceback too
    try:
        check_run(options, _project_path())
        return kedro_run.callback(**options)
    except Exception as error:
        message = describe(error)
        if message is None:
            raise
        raise RunFailed(message, error, verbose) from None


run = click.Command(
    name="run",
    callback=_run,
    params=[
        *kedro_run.params,
        click.Option(
            ["--verbose", "-v"],
            is_flag=True,
            help="Print the full traceback of an error, not only its one-line message.",
        ),
    ],
    help=kedro_run.help,
    short_help=kedro_run.short_help,
)
