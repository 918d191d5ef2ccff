"""Short content hashes: the fingerprints of training runs and the variants of evaluation
results.

Both are stored (a training run's folder is named by its fingerprint, an evaluation result
is looked up by its variant), so a digest must not change between releases: the encodings
below are fixed, and tests pin one digest of each.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, is_dataclass
from typing import Any

__all__ = ["content_hash"]


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return str(value)


def content_hash(data: Any, *, length: int = 12, spaced: bool = False) -> str:
    """The first ``length`` hex characters of the sha256 of ``data`` as canonical JSON
    (keys sorted; a dataclass as its fields, any other value JSON cannot hold as its text).

    ``spaced``: JSON with ``", "`` and ``": "`` between items instead of none, the encoding
    of evaluation result variants (kept so that stored results keep their keys).
    """
    separators = (", ", ": ") if spaced else (",", ":")
    text = json.dumps(data, sort_keys=True, separators=separators, default=_plain)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]
