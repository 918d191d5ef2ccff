"""Settings a system kind declares as its own fields, read from ``evaluation.<section>``.

A kind that annotates fields with defaults in its class body::

    class Cheapest(Baseline):
        name = "cheapest"
        n: int = 3                    # evaluation.cheapest.n
        worker: str | None = None

is made a dataclass of them (keyword-only) and is its own ``Settings``: the configured
kind is an instance with the YAML's values. :func:`read_declared` checks each value against
its annotation (``int``, ``float``, ``str``, ``bool``, ``None``, unions, ``list[...]``,
``dict[...]``, ``Literal[...]``; any other type is taken as it comes), so a wrong type
fails before any work with the key named.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

__all__ = ["declares_fields", "make_declared", "read_declared"]


def declares_fields(cls: type) -> bool:
    """Whether the class body of ``cls`` annotates a settings field (not a ``ClassVar``)."""
    own = cls.__dict__.get("__annotations__", {})
    return any("ClassVar" not in str(hint) for hint in own.values())


def make_declared(cls: type) -> None:
    """Make ``cls`` a keyword-only dataclass of its annotated fields, each with a default
    (the kind is instantiated with its defaults when it is registered)."""
    dataclasses.dataclass(cls, kw_only=True)
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise TypeError(f"{cls.__name__}: settings fields need a default: {missing}")


def _hints(cls: type) -> dict[str, Any]:
    try:
        return get_type_hints(cls)
    except (NameError, TypeError):  # an annotation naming a type out of reach: unchecked
        return {}


def _accepts(value: Any, hint: Any) -> bool:
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_accepts(value, arg) for arg in args)
    if origin is Literal:
        return value in args
    if hint is type(None) or hint is None:
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple, Sequence):
        if isinstance(value, str) or not isinstance(value, list | tuple):
            return False
        return not args or all(_accepts(v, args[0]) for v in value)
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            return False
        return not args or all(_accepts(v, args[1]) for v in value.values())
    return True


def _describe(hint: Any) -> str:
    """``int``, ``list[str] | None``: the annotation as it was written."""
    text = getattr(hint, "__name__", None) if isinstance(hint, type) else None
    return text or str(hint).replace("typing.", "").replace("NoneType", "None")


def read_declared(cls: type, section: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The values of ``section`` (keys already checked) as ``cls``'s fields take them;
    a ``ValueError`` naming ``<where>.<field>`` for a value its annotation does not admit."""
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in section:
            continue
        value, hint = section[f.name], hints.get(f.name, Any)
        if not _accepts(value, hint):
            raise ValueError(f"{where}.{f.name}: must be {_describe(hint)}, got {value!r}")
        values[f.name] = value
    return values
