"""Short content hashes: the fingerprints of training runs, the variants of evaluation
results, the ids of tasks made from a question, the identity of an adapter folder.

All are stored (a training run's folder is named by its fingerprint, an evaluation result
is looked up by its variant, a task keeps its id), so a digest must not change between
releases: the encodings below are fixed, and tests/test_hashing.py pins one digest of each.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

__all__ = ["content_hash", "files_hash"]


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return str(value)


def content_hash(data: Any, *, length: int = 12, spaced: bool = False) -> str:
    """The first ``length`` hex characters of the sha256 of ``data``: bytes as they are,
    anything else as canonical JSON (keys sorted; a dataclass as its fields, any other value
    JSON cannot hold as its text).

    ``spaced``: JSON with ``", "`` and ``": "`` between items instead of none, the encoding
    of evaluation result variants (kept so that stored results keep their keys).
    """
    if isinstance(data, bytes):
        return hashlib.sha256(data).hexdigest()[:length]
    separators = (", ", ": ") if spaced else (",", ":")
    text = json.dumps(data, sort_keys=True, separators=separators, default=_plain)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def files_hash(paths: Iterable[Path], *, length: int = 12) -> str:
    """The content hash of files, in the order given: each file's name, then its bytes."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:length]
