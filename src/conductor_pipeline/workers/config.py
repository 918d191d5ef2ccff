"""Worker specifications: what ``conf/*/workers.yml`` declares about each worker LLM.

One entry per worker, in the order the Conductor numbers them::

    workers:
      - name: sim-generalist
        model: openai/sim-generalist          # any litellm model string
        description: Solid all-rounder, cheap.
        api_base: http://127.0.0.1:8765/v1
        api_key_env: SANDBOX_API_KEY          # or credentials_key: <entry of credentials.yml>
        temperature: 0.7
        max_tokens: 512
        top_p: 1.0
        extra_params: {}                      # any other completion kwargs
        input_cost_per_token: 1.0e-7          # omit both to use litellm's price map
        output_cost_per_token: 4.0e-7
        timeout_s: 60
        max_concurrency: 8
        num_retries: 2
        fallbacks: [sim-backup]

An optional top-level ``defaults:`` mapping supplies values for keys an entry leaves out.
API keys never live in this file: an entry names an environment variable (``api_key_env``) or
an entry of the credentials mapping (``credentials_key``; Kedro's ``credentials.yml``), and
``load_worker_specs`` resolves it. A literal ``api_key`` in a worker entry is refused.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conductor_pipeline.config_checks import check_keys

__all__ = ["Secret", "WorkerConfigError", "WorkerSpec", "load_worker_specs"]


class WorkerConfigError(ValueError):
    """The worker configuration is invalid; the message names the worker and the key."""


class Secret:
    """A credential that never shows itself in ``repr``/``str`` (nor in dataclass reprs)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __reduce__(self) -> Any:
        # Pickling is allowed (multiprocessing needs it) but keeps the value: do not log pickles.
        return (Secret, (self._value,))


@dataclass(frozen=True)
class WorkerSpec:
    """One worker of the pool, validated. ``api_key`` is resolved and hidden from ``repr``."""

    name: str
    model: str
    description: str = ""
    api_base: str | None = None
    api_key_env: str | None = None
    credentials_key: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    extra_params: Mapping[str, Any] = field(default_factory=dict, hash=False)
    input_cost_per_token: float | None = None
    output_cost_per_token: float | None = None
    timeout_s: float = 60.0
    max_concurrency: int = 8
    num_retries: int = 2
    fallbacks: tuple[str, ...] = ()
    api_key: Secret | None = field(default=None, repr=False, compare=False)

    @property
    def sampling_params(self) -> dict[str, Any]:
        """The completion kwargs this worker is called with (part of the cache key)."""
        params: dict[str, Any] = {}
        for key in ("temperature", "max_tokens", "top_p"):
            value = getattr(self, key)
            if value is not None:
                params[key] = value
        params.update(self.extra_params)
        return params

    @property
    def has_prices(self) -> bool:
        return self.input_cost_per_token is not None and self.output_cost_per_token is not None

    @property
    def provider(self) -> str:
        return self.model.split("/", 1)[0] if "/" in self.model else ""


_STR_KEYS = ("name", "model", "description", "api_base", "api_key_env", "credentials_key")
_ALLOWED_KEYS = frozenset(
    {
        *_STR_KEYS,
        "temperature",
        "max_tokens",
        "top_p",
        "extra_params",
        "input_cost_per_token",
        "output_cost_per_token",
        "timeout_s",
        "max_concurrency",
        "num_retries",
        "fallbacks",
    }
)
_SECRET_KEYS = frozenset({"api_key", "key", "secret", "token", "password"})
_TOP_LEVEL_KEYS = frozenset({"workers", "defaults"})


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _number(where: str, key: str, value: Any, *, minimum: float, strict: bool = False) -> float:
    if not _is_number(value):
        raise WorkerConfigError(f"{where}: '{key}' must be a number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        relation = ">" if strict else ">="
        raise WorkerConfigError(f"{where}: '{key}' must be {relation} {minimum}, got {value!r}")
    return float(value)


def _integer(where: str, key: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkerConfigError(f"{where}: '{key}' must be an integer, got {value!r}")
    if value < minimum:
        raise WorkerConfigError(f"{where}: '{key}' must be >= {minimum}, got {value!r}")
    return value


def _resolve_key(
    where: str,
    entry: Mapping[str, Any],
    credentials: Mapping[str, Any] | None,
    environ: Mapping[str, str],
) -> Secret | None:
    env_name = entry.get("api_key_env")
    cred_name = entry.get("credentials_key")
    if env_name and cred_name:
        raise WorkerConfigError(f"{where}: give 'api_key_env' or 'credentials_key', not both")
    if env_name:
        value = environ.get(env_name)
        if not value:
            raise WorkerConfigError(
                f"{where}: 'api_key_env' names the environment variable {env_name!r}, "
                "which is not set"
            )
        return Secret(value)
    if cred_name:
        if not credentials or cred_name not in credentials:
            raise WorkerConfigError(
                f"{where}: 'credentials_key' {cred_name!r} is not in the credentials"
            )
        found = credentials[cred_name]
        if isinstance(found, Mapping):
            found = found.get("api_key")
        if not isinstance(found, str) or not found:
            raise WorkerConfigError(
                f"{where}: credentials entry {cred_name!r} must be a non-empty string "
                "or a mapping with a non-empty 'api_key'"
            )
        return Secret(found)
    return None


def _parse_entry(
    position: int,
    raw: Any,
    defaults: Mapping[str, Any],
    credentials: Mapping[str, Any] | None,
    environ: Mapping[str, str],
) -> WorkerSpec:
    if not isinstance(raw, Mapping):
        raise WorkerConfigError(f"workers[{position}]: must be a mapping, got {type(raw).__name__}")
    entry = {**defaults, **raw}
    name = entry.get("name")
    where = f"workers[{position}]" + (f" ({name!r})" if isinstance(name, str) else "")

    secretish = sorted(set(entry) & _SECRET_KEYS)
    if secretish:
        raise WorkerConfigError(
            f"{where}: key {secretish[0]!r} is not allowed: keep secrets out of workers.yml; "
            "use 'api_key_env' (an environment variable) or 'credentials_key' (credentials.yml)"
        )
    check_keys(where, entry, _ALLOWED_KEYS, error=WorkerConfigError)
    for key in _STR_KEYS:
        value = entry.get(key)
        if value is not None and not isinstance(value, str):
            raise WorkerConfigError(f"{where}: '{key}' must be a string, got {value!r}")
    if not name or not name.strip():
        raise WorkerConfigError(f"{where}: missing 'name'")
    if name != name.strip() or "/" in name:
        raise WorkerConfigError(f"{where}: 'name' must not contain '/' or surrounding spaces")
    model = entry.get("model")
    if not model or not model.strip():
        raise WorkerConfigError(f"{where}: missing 'model' (a litellm model string)")

    kwargs: dict[str, Any] = {"name": name, "model": model.strip()}
    kwargs["description"] = (entry.get("description") or "").strip()
    kwargs["api_base"] = entry.get("api_base") or None
    kwargs["api_key_env"] = entry.get("api_key_env") or None
    kwargs["credentials_key"] = entry.get("credentials_key") or None

    if entry.get("temperature") is not None:
        kwargs["temperature"] = _number(where, "temperature", entry["temperature"], minimum=0)
    if entry.get("top_p") is not None:
        top_p = _number(where, "top_p", entry["top_p"], minimum=0, strict=True)
        if top_p > 1:
            raise WorkerConfigError(f"{where}: 'top_p' must be <= 1, got {top_p!r}")
        kwargs["top_p"] = top_p
    if entry.get("max_tokens") is not None:
        kwargs["max_tokens"] = _integer(where, "max_tokens", entry["max_tokens"], minimum=1)
    extra = entry.get("extra_params") or {}
    if not isinstance(extra, Mapping):
        raise WorkerConfigError(f"{where}: 'extra_params' must be a mapping")
    clash = sorted(set(extra) & ({"model", "messages", "api_base"} | _SECRET_KEYS))
    if clash:
        raise WorkerConfigError(f"{where}: 'extra_params' must not set {clash[0]!r}")
    kwargs["extra_params"] = dict(extra)

    for key in ("input_cost_per_token", "output_cost_per_token"):
        if entry.get(key) is not None:
            kwargs[key] = _number(where, key, entry[key], minimum=0)
    if ("input_cost_per_token" in kwargs) != ("output_cost_per_token" in kwargs):
        raise WorkerConfigError(
            f"{where}: give both 'input_cost_per_token' and 'output_cost_per_token', or neither"
        )
    if entry.get("timeout_s") is not None:
        kwargs["timeout_s"] = _number(
            where, "timeout_s", entry["timeout_s"], minimum=0, strict=True
        )
    if entry.get("max_concurrency") is not None:
        kwargs["max_concurrency"] = _integer(
            where, "max_concurrency", entry["max_concurrency"], minimum=1
        )
    if entry.get("num_retries") is not None:
        kwargs["num_retries"] = _integer(where, "num_retries", entry["num_retries"], minimum=0)

    fallbacks = entry.get("fallbacks") or []
    if isinstance(fallbacks, str):
        fallbacks = [fallbacks]
    if not isinstance(fallbacks, list | tuple) or not all(isinstance(f, str) for f in fallbacks):
        raise WorkerConfigError(f"{where}: 'fallbacks' must be a list of worker names")
    if name in fallbacks:
        raise WorkerConfigError(f"{where}: 'fallbacks' must not name the worker itself")
    if len(set(fallbacks)) != len(fallbacks):
        raise WorkerConfigError(f"{where}: 'fallbacks' lists a worker twice")
    kwargs["fallbacks"] = tuple(fallbacks)

    kwargs["api_key"] = _resolve_key(where, entry, credentials, environ)
    return WorkerSpec(**kwargs)


def load_worker_specs(
    config: Mapping[str, Any] | list[Any],
    credentials: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> list[WorkerSpec]:
    """Validate a workers config and return one ``WorkerSpec`` per worker, in order.

    ``config`` is the parsed ``workers.yml`` (``{"workers": [...], "defaults": {...}}``) or
    the bare list of entries. Keys are looked up in ``credentials`` or in ``environ``
    (default ``os.environ``) only. Raises ``WorkerConfigError`` naming the offending entry
    and key on the first problem.
    """
    environ = os.environ if environ is None else environ
    if isinstance(config, list):
        entries, defaults = config, {}
    elif isinstance(config, Mapping):
        unknown = sorted(set(config) - _TOP_LEVEL_KEYS)
        if unknown:
            raise WorkerConfigError(
                f"workers config: unknown top-level key {unknown[0]!r} (allowed: defaults, workers)"
            )
        entries = config.get("workers")
        defaults = config.get("defaults") or {}
        if not isinstance(defaults, Mapping):
            raise WorkerConfigError("workers config: 'defaults' must be a mapping")
        if "name" in defaults:
            raise WorkerConfigError("workers config: 'defaults' must not set 'name'")
    else:
        raise WorkerConfigError(f"workers config must be a mapping, got {type(config).__name__}")
    if not isinstance(entries, list) or not entries:
        raise WorkerConfigError("workers config: 'workers' must be a non-empty list")

    specs: list[WorkerSpec] = []
    seen: set[str] = set()
    for position, raw in enumerate(entries):
        spec = _parse_entry(position, raw, defaults, credentials, environ)
        if spec.name in seen:
            raise WorkerConfigError(f"workers[{position}]: duplicate worker name {spec.name!r}")
        seen.add(spec.name)
        specs.append(spec)
    for position, spec in enumerate(specs):
        for target in spec.fallbacks:
            if target not in seen:
                raise WorkerConfigError(
                    f"workers[{position}] ({spec.name!r}): 'fallbacks' names unknown worker "
                    f"{target!r}"
                )
    return specs
