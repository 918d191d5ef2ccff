"""A log handler that writes to whatever ``sys.stderr`` is when a record comes.

``logging.StreamHandler(sys.stderr)`` keeps the stream object it was given. When something
replaces ``sys.stderr`` for a while and then closes its replacement (pytest capturing one
test, a notebook cell's redirect), every later record through that handler fails with
"I/O operation on closed file", from whichever thread logs next: a server still answering
requests prints a "Logging error" traceback for each of them. :class:`StderrHandler` looks
``sys.stderr`` up for every record, as the standard library's last-resort handler does.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

__all__ = ["StderrHandler"]


class StderrHandler(logging.StreamHandler):
    """A ``StreamHandler`` on the current ``sys.stderr``."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        logging.Handler.__init__(self, level)  # StreamHandler's would fix a stream

    @property
    def stream(self) -> TextIO:  # type: ignore[override]
        return sys.stderr
