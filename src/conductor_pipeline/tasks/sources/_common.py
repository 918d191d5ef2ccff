"""Small helpers shared by the task sources."""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any

# Labels the simulated workers' skill tables are keyed on (conf/base/sandbox_workers.yml).
DIFFICULTIES = ("easy", "medium", "hard")

# A plain decimal number, optionally signed, with an optional exponent: "12", "-0.5", "3e8".
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def looks_numeric(text: str) -> bool:
    """Whether ``text`` is a single plain number (what answer_format "number" promises)."""
    return bool(_NUMBER.fullmatch(text.strip()))


def json_safe(value: Any) -> Any:
    """A copy of ``value`` made only of JSON types.

    Task metadata is stored as a JSON column, so tuples and sets become lists, mapping keys
    become strings, numpy scalars and arrays become Python values, and anything else without a
    JSON form (``Fraction``, ``Decimal``, dates...) becomes its ``str``.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        # NaN and infinities are not JSON; keep them readable rather than failing.
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    if isinstance(value, set | frozenset):
        # Sets have no order; sort so that the same set always serialises the same way.
        return sorted((json_safe(item) for item in value), key=repr)
    if isinstance(value, Fraction | Decimal):
        return str(value)
    # numpy scalars and arrays, without importing numpy for the common case.
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return json_safe(tolist())
    return str(value)


def derived_seed(*parts: object) -> int:
    """A 31-bit seed from ``parts``, stable across processes (unlike ``hash``)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def seeded_subset(n: int, limit: int | None, seed: int) -> list[int]:
    """Indices of ``limit`` of ``n`` rows, drawn with ``seed`` and kept in source order.

    A plain head would be biased: MMLU, for one, is sorted by subject, so its first hundred
    rows are all abstract algebra.
    """
    check_limit(limit)
    if limit is None or limit >= n:
        return list(range(n))
    return sorted(random.Random(seed).sample(range(n), limit))


def check_limit(limit: int | None) -> None:
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")
