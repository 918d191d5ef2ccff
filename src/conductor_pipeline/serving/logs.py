"""Structured logs for the API process: one JSON object per line, secrets masked.

Every record becomes ``{"ts", "level", "logger", "message", ...fields}``; the access log
adds its fields (request id, status, latency, cost, steps, ...) through
``extra={"fields": {...}}``. Known secret values (the API key, credentials.yml values, the
policy server's key) are replaced by ``***`` in every line, as a last line of defence: the
server never logs headers or credentials in the first place.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from conductor_pipeline.stderr_logging import StderrHandler

MASK = "***"


def secret_values(*sources: Any) -> list[str]:
    """Every string of at least 8 characters inside mappings, lists or plain values."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            if len(value) >= 8:
                found.add(value)
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple | set):
            for item in value:
                walk(item)

    for source in sources:
        walk(source)
    return sorted(found, key=len, reverse=True)


class JsonFormatter(logging.Formatter):
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def _mask(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": self._mask(record.getMessage()),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self._mask(self.formatException(record.exc_info))
        return self._mask(json.dumps(entry, default=str, ensure_ascii=False))


def configure_json_logging(level: int = logging.INFO, secrets: Iterable[str] = ()) -> JsonFormatter:
    """Send every log record (and Python warning) of this process to stderr as JSON lines;
    returns the formatter, whose ``secrets`` may be extended once they are known."""
    formatter = JsonFormatter(secrets)
    handler = StderrHandler()
    handler.setFormatter(formatter)
    logging.captureWarnings(True)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    for name in ("conductor_pipeline", "uvicorn", "uvicorn.error"):
        logging.getLogger(name).setLevel(level)
    # litellm logs request details (and may echo keys) at INFO; keep it to warnings
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return formatter
