"""Plain data: the only values that cross between the check driver and the candidate.

Used by ``sandbox_check`` (check mode of ``sandbox_harness``) on both sides of HumanEval's
two-process check (and copied next to it into the sandbox, so it uses the standard library
only). A value is *plain* when it is built from None, bool, int, float, complex, str, bytes,
bytearray, list, tuple, dict, set and frozenset; ``decode`` only ever builds objects of
exactly those types, so a comparison with a decoded value runs Python's own ``==``, never
one the candidate wrote.
"""

from __future__ import annotations

from typing import Any

__all__ = ["decode", "encode"]

# Plain data nested deeper than this is refused (a reply is untrusted input).
_MAX_DEPTH = 100


def encode(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON-ready data, or TypeError when it is not built from plain types.

    Tags keep what JSON cannot: tuple vs list, sets, non-string keys, bytes, complex, and
    exact floats (``float.hex`` carries nan, inf and every bit). Subclasses of plain types
    are reduced to their base type (a Counter becomes a dict, a namedtuple a tuple), as ``==``
    would treat an honest one; a dishonest ``__eq__`` is thereby dropped, not trusted.
    """
    if depth > _MAX_DEPTH:
        raise TypeError("the value is nested too deeply")
    if value is None or type(value) is bool or type(value) is str:
        return value
    if isinstance(value, int):  # bool is final, so this is int or an int subclass
        number = int.__index__(value)
        return number if -(2**53) < number < 2**53 else ["i", format(number, "x")]
    if isinstance(value, float):
        return ["f", float.hex(float.__float__(value))]
    if isinstance(value, complex):
        return ["c", float.hex(value.real), float.hex(value.imag)]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bytes | bytearray):
        return ["b" if isinstance(value, bytes) else "B", bytes(value).hex()]
    nested = depth + 1
    if isinstance(value, list):
        return ["l", [encode(item, nested) for item in list.__iter__(value)]]
    if isinstance(value, tuple):
        return ["t", [encode(item, nested) for item in tuple.__iter__(value)]]
    if isinstance(value, dict):
        return ["d", [[encode(k, nested), encode(v, nested)] for k, v in dict.items(value)]]
    if isinstance(value, set):
        return ["s", [encode(item, nested) for item in set.__iter__(value)]]
    if isinstance(value, frozenset):
        return ["S", [encode(item, nested) for item in frozenset.__iter__(value)]]
    raise TypeError(f"{type(value).__name__} is not plain data")


_SCALAR_TAGS = {
    "i": lambda text: int(text, 16),
    "f": float.fromhex,
    "b": bytes.fromhex,
    "B": lambda text: bytearray.fromhex(text),
}
_CONTAINER_TAGS = {"l": list, "t": tuple, "s": set, "S": frozenset}


def decode(data: Any, depth: int = 0) -> Any:
    """The plain value ``encode`` described; ValueError for anything else.

    Every object built here has a plain type, so comparisons with it use Python's own
    ``==``. Untrusted input: depth-limited, and only the tags above are accepted.
    """
    if depth > _MAX_DEPTH:
        raise ValueError("the value is nested too deeply")
    if data is None or type(data) in (bool, int, str):
        return data
    if type(data) is not list or not data or type(data[0]) is not str:
        raise ValueError(f"not an encoded value: {type(data).__name__}")
    tag, rest = data[0], data[1:]
    try:
        if tag in _SCALAR_TAGS and len(rest) == 1 and type(rest[0]) is str:
            return _SCALAR_TAGS[tag](rest[0])
        if tag == "c" and len(rest) == 2 and all(type(x) is str for x in rest):
            return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
        if len(rest) != 1 or type(rest[0]) is not list:
            raise ValueError(f"malformed value with tag {tag!r}")
        if tag in _CONTAINER_TAGS:
            return _CONTAINER_TAGS[tag](decode(item, depth + 1) for item in rest[0])
        if tag == "d":
            pairs = rest[0]
            if not all(type(p) is list and len(p) == 2 for p in pairs):
                raise ValueError("malformed dict")
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in pairs}
    except (TypeError, OverflowError) as exc:  # unhashable key, bad hex, ...
        raise ValueError(f"malformed value with tag {tag!r}: {exc}") from exc
    raise ValueError(f"unknown tag {tag!r}")
