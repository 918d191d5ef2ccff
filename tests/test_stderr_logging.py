"""Logging set up while ``sys.stderr`` is a temporary replacement keeps working once that
replacement is closed (pytest's capture of one test, a notebook cell's redirect). Before, a
server thread still answering requests printed "Logging error ... I/O operation on closed
file" for each access line, after a test had run the CLI in-process."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from conductor_pipeline.cli import configure_cli_logging
from conductor_pipeline.serving.logs import configure_json_logging
from conductor_pipeline.stderr_logging import StderrHandler

# loggers whose levels the configurations set
NAMED = ("conductor_pipeline", "uvicorn", "uvicorn.error", "LiteLLM", "LiteLLM Router",
         "LiteLLM Proxy", "httpx")  # fmt: skip


@pytest.fixture
def root_logging():
    """The root logger, its handlers and the named loggers' levels put back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in NAMED}
    yield root
    logging.captureWarnings(False)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    for name, named_level in levels.items():
        logging.getLogger(name).setLevel(named_level)


@pytest.mark.parametrize(
    "configure",
    [lambda: configure_cli_logging(verbose=True), configure_json_logging],
    ids=["cli", "serving"],
)
def test_records_go_to_the_current_stderr_after_the_old_one_closed(
    configure, root_logging, monkeypatch
):
    temporary = io.StringIO()
    with monkeypatch.context() as patch:
        patch.setattr(sys, "stderr", temporary)
        configure()
    temporary.close()
    assert [type(h) for h in root_logging.handlers] == [StderrHandler]
    now = io.StringIO()
    monkeypatch.setattr(sys, "stderr", now)
    failed: list[BaseException | None] = []
    monkeypatch.setattr(
        logging.Handler, "handleError", lambda self, record: failed.append(sys.exc_info()[1])
    )
    logging.getLogger("conductor_pipeline.test").warning("after the close")
    assert failed == []
    assert "after the close" in now.getvalue()
