"""Building a configuration dataclass tree from a parameters mapping: every key checked
against the dataclass's fields, every value against its type hint (``bool``, ``int``,
``float``, ``str``, optional values, tuples of strings, mappings, nested dataclasses), and
a dataclass's own ``ValueError`` turned into the configuration's error, prefixed with the
path of the offending key (``training.grpo.beta: beta must be >= 0``)."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from conductor_pipeline.config_checks import check_int, check_keys

__all__ = ["build_dataclass"]


def build_dataclass(cls: type, data: Any, where: str, error: type[ValueError]) -> Any:
    """``cls`` built from ``data`` (a mapping, or already a ``cls``); ``where``: the path of
    ``data`` in the parameters; ``error``: the exception raised, naming the key's path."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise error(f"{where}: must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    check_keys(where, data, fields, error=error)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        kwargs[name] = _coerce(hints[name], value, f"{where}.{name}", error)
    try:
        return cls(**kwargs)
    except ValueError as err:
        if isinstance(err, error):
            raise
        message = str(err)
        first = message.split(" ", 1)[0]
        path = f"{where}.{first}" if first in fields else where
        raise error(f"{path}: {message}") from None


_KIND_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _coerce(hint: Any, value: Any, where: str, error: type[ValueError]) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise error(f"{where}: must not be null")
        # the first type that takes the value (``bool | str``: true, false or a word)
        non_null = [a for a in args if a is not type(None)]
        if len(non_null) == 1:
            return _coerce(non_null[0], value, where, error)
        for alternative in non_null:
            try:
                return _coerce(alternative, value, where, error)
            except error:
                continue
        kinds = " or ".join(_KIND_NAMES.get(a, getattr(a, "__name__", str(a))) for a in non_null)
        raise error(f"{where}: must be {kinds}, got {value!r}")
    if dataclasses.is_dataclass(hint):
        return build_dataclass(hint, value, where, error)
    if hint is bool:
        if not isinstance(value, bool):
            raise error(f"{where}: must be true or false, got {value!r}")
        return value
    if hint is int:
        return check_int(value, where, minimum=None, error=error)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise error(f"{where}: must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise error(f"{where}: must be a string, got {value!r}")
        return value
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise error(f"{where}: must be a list, got {value!r}")
        if not all(isinstance(v, str) for v in value):
            raise error(f"{where}: entries must be strings")
        return tuple(value)
    if origin in (Mapping, dict) or hint in (Mapping, dict):
        if not isinstance(value, Mapping):
            raise error(f"{where}: must be a mapping, got {value!r}")
        if not all(isinstance(k, str) for k in value):
            raise error(f"{where}: keys must be strings")
        value_hint = args[1] if len(args) == 2 else str
        return {k: _coerce(value_hint, v, f"{where}.{k}", error) for k, v in value.items()}
    return value
