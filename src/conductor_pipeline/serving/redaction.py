"""Masking of credentials in what the capture and feedback stores write.

Three layers, each replacing what it finds by ``***``:

1. **known values**: the keys and credentials the server was given (the ones the access log
   masks) and the value of every environment variable whose name looks secret
   (``*_API_KEY``, ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ...), whether a worker uses it
   or not. A value is found even when line breaks or spaces were put inside it;
2. **key shapes**: the common formats of provider keys and tokens (``sk-...``, ``ghp_...``,
   ``AKIA...``, ``AIza...``, ``hf_...``, ``xox?-...``, JWTs, PEM private keys, a bearer
   token, ``api_key=...``-style assignments), also across one line break;
3. **high-entropy tokens**: a run of at least ``_MIN_TOKEN_CHARS`` key characters (one line
   break allowed inside) that mixes letters and digits and has a high character entropy, as
   random keys do and words, numbers and formulas do not.

Under identifier fields (``request_id``, ``time``, the served ``model``, worker names) only
the known values are masked: a request id is a random token by design and is what feedback
joins on.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
# environment variable names whose values are treated as secrets
SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|AUTH|PRIVATE|COOKIE|SESSION|SIGNATURE|DSN",
    re.IGNORECASE,
)
_MIN_SECRET_CHARS = 8  # shorter values ("true", a port) would mask ordinary text
_MIN_TOKEN_CHARS = 20
_MIN_PART_CHARS = 12  # a formula like "2x+3y+4z+..." is many short parts
_MIN_HEX_CHARS = 32
# changes of kind (digit, upper, lower) per character: about 0.6 at random, at most
# about 0.3 in names and identifiers
_MIN_CHANGE_RATE = 0.4
_HEX = re.compile(r"[0-9a-f]+|[0-9A-F]+")
# a line break (with the indentation around it) inside a key; never empty, so that no
# repetition below can match nothing and backtrack without end
_BREAK = r"(?:[ \t]*\r?\n[ \t]*)"
_KEY_CHARS = r"[A-Za-z0-9_\-]"
_KEY_SHAPES = [
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)",
    rf"\bsk-(?:ant-|proj-|or-v1-|live_|test_)?(?:{_KEY_CHARS}|{_BREAK}){{16,}}",
    rf"\b(?:ghp|gho|ghu|ghs|ghr|github_pat)_(?:[A-Za-z0-9_]|{_BREAK}){{20,}}",
    rf"\bxox[abposr]-(?:[A-Za-z0-9\-]|{_BREAK}){{10,}}",
    rf"\b(?:AKIA|ASIA)(?:[0-9A-Z]|{_BREAK}){{16}}",
    rf"\bAIza(?:{_KEY_CHARS}|{_BREAK}){{30,}}",
    rf"\bhf_(?:[A-Za-z0-9]|{_BREAK}){{20,}}",
    rf"\bglpat-(?:{_KEY_CHARS}|{_BREAK}){{20,}}",
    r"\beyJ[A-Za-z0-9_\-]{8,}\.(?:eyJ)?[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
    rf"(?i:\bbearer)\s+(?:[A-Za-z0-9_\-.~+/]|{_BREAK}){{12,}}=*",
]
_ASSIGNMENT = re.compile(
    r"(?i)\b([A-Za-z0-9_\-]*(?:api[_\-]?key|secret|token|passw(?:or)?d|access[_\-]?key)"
    r"[A-Za-z0-9_\-]*[\"']?\s*[:=]\s*[\"']?)([^\s\"',;]{8,})"
)
_TOKEN = re.compile(rf"[A-Za-z0-9_\-+/=]{{4,}}(?:{_BREAK}[A-Za-z0-9_\-+/=]+)*")
# fields holding identifiers the store itself made, never a user's text
SKIPPED_FIELDS = frozenset({"request_id", "time", "model", "worker", "worker_name"})


def environment_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of environment variables whose name looks secret (``SECRET_NAME``), but
    for short values and plain lowercase words, which would mask ordinary text."""
    environ = os.environ if environ is None else environ
    found = []
    for name, value in environ.items():
        value = value.strip()
        if not SECRET_NAME.search(name) or len(value) < _MIN_SECRET_CHARS:
            continue
        if value.isalpha() and value.islower():  # a setting ("AUTH_MODE=disabled"), no key
            continue
        found.append(value)
    return found


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _kind(char: str) -> str:
    return "digit" if char.isdigit() else "upper" if char.isupper() else "lower"


def looks_random(token: str) -> bool:
    """Whether ``token`` (line breaks removed) looks like a generated key: long, with a long
    alphanumeric part, digits and letter cases changing as often as at random, and a high
    character entropy. Words, names ("Qwen2-VL-7B-Instruct"), CamelCase identifiers,
    numbers and formulas change kind far less often."""
    if len(token) < _MIN_TOKEN_CHARS:
        return False
    parts = re.split(r"[^A-Za-z0-9]+", token)
    if max(map(len, parts)) < _MIN_PART_CHARS:
        return False
    changes = sum(
        1 for part in parts for a, b in zip(part, part[1:], strict=False) if _kind(a) != _kind(b)
    )
    if _HEX.fullmatch(token):  # one case of one alphabet: only digit/letter changes count
        return len(token) >= _MIN_HEX_CHARS and changes >= 8 and _entropy(token) >= 3.0
    return changes >= _MIN_CHANGE_RATE * sum(map(len, parts)) and _entropy(token) >= 3.5


class SecretMasker:
    """Masks credentials in strings and JSON-like data (see the module docstring)."""

    def __init__(self, secrets: Iterable[str] = (), *, environ: Mapping[str, str] | None = None):
        values = {s.strip() for s in secrets if s and len(s.strip()) >= _MIN_SECRET_CHARS}
        values.update(environment_secrets(environ))
        # longest first, so a value that contains another is masked whole
        ordered = sorted(values, key=len, reverse=True)
        # whitespace (a line break, an indent) may have been put anywhere inside a value
        known = [r"\s*".join(re.escape(char) for char in value) for value in ordered]
        self._known = re.compile("|".join(known)) if known else None
        self._shapes = re.compile("|".join(f"(?:{shape})" for shape in _KEY_SHAPES))

    def mask(self, text: str) -> str:
        """``text`` with every known value, key shape and random-looking token masked."""
        text = self.mask_known(text)
        text = self._shapes.sub(MASK, text)
        text = _ASSIGNMENT.sub(_mask_assigned, text)
        return _TOKEN.sub(_mask_random, text)

    def mask_known(self, text: str) -> str:
        """``text`` with the known values masked (the first layer only)."""
        return self._known.sub(MASK, text) if self._known is not None else text

    def mask_data(self, value: Any, skipped: frozenset[str] = SKIPPED_FIELDS) -> Any:
        """``value`` with :meth:`mask` applied to every string; under a ``skipped`` key only
        the known values are masked."""
        if isinstance(value, str):
            return self.mask(value)
        if isinstance(value, Mapping):
            return {
                k: self._known_only(v) if k in skipped else self.mask_data(v, skipped)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.mask_data(v, skipped) for v in value]
        return value

    def _known_only(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.mask_known(value)
        if isinstance(value, Mapping):
            return {k: self._known_only(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._known_only(v) for v in value]
        return value


def _mask_assigned(match: re.Match[str]) -> str:
    # "token: transformer" is prose; a value with letters and digits is a credential
    value = match[2]
    keep = not (any(c.isdigit() for c in value) and any(c.isalpha() for c in value))
    return match[0] if keep else match[1] + MASK


def _mask_random(match: re.Match[str]) -> str:
    joined = re.sub(r"\s", "", match[0])
    return MASK if looks_random(joined) else match[0]
