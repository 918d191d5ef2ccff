"""Checks shared by every configuration section: unknown keys and integer settings.

One message format wherever a key is unknown, so a typo reads the same in ``training``,
``serving`` or ``worker_pool``::

    evaluation: unknown key 'test_per_domian' (did you mean 'test_per_domain'?); known keys: ...

Standard library only: the core packages (``workflow``, ``workers``, ``tasks``) import it,
and they must not pull in Kedro or MLflow.
"""

from __future__ import annotations

from collections.abc import Iterable
from difflib import get_close_matches
from typing import Any, Literal, overload

__all__ = ["check_int", "check_keys", "is_int", "unknown_keys_message"]


def unknown_keys_message(section: str, unknown: Iterable[Any], allowed: Iterable[Any]) -> str:
    """The message for keys of ``section`` outside ``allowed``: each unknown key with the
    closest allowed one when there is one, then every allowed key."""
    known = sorted(str(key) for key in allowed)
    named = []
    for key in sorted(unknown, key=str):
        close = get_close_matches(str(key), known, n=1)
        named.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    noun = "key" if len(named) == 1 else "keys"
    return f"{section}: unknown {noun} {', '.join(named)}; known keys: {', '.join(known)}"


def check_keys(
    section: str,
    given: Iterable[Any],
    allowed: Iterable[Any],
    *,
    error: type[Exception] = ValueError,
) -> None:
    """Raise ``error`` (a ``ValueError`` unless the section has its own type) naming every
    key of ``given`` (a mapping or its keys) that is not in ``allowed``."""
    allowed = set(allowed)
    unknown = [key for key in given if key not in allowed]
    if unknown:
        raise error(unknown_keys_message(section, unknown, allowed))


def is_int(value: Any, *, minimum: int | None = 0) -> bool:
    """Whether ``value`` is an integer ``>= minimum`` (any integer where ``minimum`` is
    ``None``; a bool is not an integer here)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    return minimum is None or value >= minimum


@overload
def check_int(
    value: Any,
    key: str,
    *,
    minimum: int | None = ...,
    allow_none: Literal[False] = ...,
    error: type[Exception] = ...,
) -> int: ...
@overload
def check_int(
    value: Any,
    key: str,
    *,
    minimum: int | None = ...,
    allow_none: bool,
    error: type[Exception] = ...,
) -> int | None: ...
def check_int(
    value: Any,
    key: str,
    *,
    minimum: int | None = 0,
    allow_none: bool = False,
    error: type[Exception] = ValueError,
) -> int | None:
    """``value`` when it is an integer ``>= minimum`` (any integer where ``minimum`` is
    ``None``; or ``None`` where ``allow_none``); otherwise ``error`` naming ``key``, the full
    dotted name (``evaluation.seed``)."""
    if value is None and allow_none:
        return None
    if not is_int(value, minimum=minimum):
        kind = {None: "an integer", 1: "a positive integer"}.get(
            minimum, f"an integer >= {minimum}"
        )
        raise error(f"{key}: must be {kind}{' or null' if allow_none else ''}, got {value!r}")
    return value
