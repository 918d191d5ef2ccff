"""Declared profiles of the sandbox workers (``conf/base/sandbox_workers.yml``).

The YAML is parsed into frozen dataclasses and checked strictly: an unknown, missing or
out-of-range key raises :class:`ProfileError` naming it (``simulated[2].skill.math.hard``),
so a typo cannot silently change the simulation. :func:`sandbox_pool_config` turns the
profiles into the worker entries of the pool, which makes this file the one source of the
sandbox workers' names, descriptions and prices.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from conductor_pipeline.config_checks import check_int, check_keys
from conductor_pipeline.workers.local_model import MODEL_DTYPES

SIM_PREFIX = "sim-"
DEFAULT_DOMAIN = "default"
DEFAULT_DIFFICULTY = "default"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class ProfileError(ValueError):
    """The sandbox profile file is invalid; the message names the offending key."""


@dataclass(frozen=True)
class Latency:
    median_s: float
    sigma: float = 0.0
    per_output_token_s: float = 0.0


@dataclass(frozen=True)
class SimulatedProfile:
    """A simulated worker: what it costs, how slow and wordy it is, and what it can solve."""

    name: str
    description: str
    input_cost_per_token: float
    output_cost_per_token: float
    latency: Latency
    mean_words: float
    skill: Mapping[str, Mapping[str, float]]
    verify_skill: float
    guess_rate: float
    timeout_s: float = 60.0
    # share of calls that draw fresh luck on a task instead of the worker's fixed luck
    call_variation: float = 0.0

    def skill_for(self, domain: str, difficulty: str) -> float:
        """Probability of solving a visible task of this domain and difficulty.

        An unknown domain uses the ``default`` domain; an unknown difficulty uses the
        domain's ``default`` entry, else the mean over its difficulties.
        """
        table = self.skill.get(domain)
        if table is None:
            table = self.skill[DEFAULT_DOMAIN]
        if difficulty in table:
            return table[difficulty]
        if DEFAULT_DIFFICULTY in table:
            return table[DEFAULT_DIFFICULTY]
        return sum(table.values()) / len(table)


@dataclass(frozen=True)
class RealProfile:
    """A real language model served by the sandbox (SmolLM2-135M-Instruct)."""

    name: str
    description: str
    input_cost_per_token: float
    output_cost_per_token: float
    model: str = "smollm2-135m-instruct"
    max_tokens: int = 96
    timeout_s: float = 120.0
    dtype: str = "float32"  # float32, bfloat16 or auto (workers.local_model.model_dtype)


@dataclass(frozen=True)
class SandboxProfiles:
    simulated: tuple[SimulatedProfile, ...]
    real: tuple[RealProfile, ...] = field(default_factory=tuple)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.simulated] + [p.name for p in self.real]

    def get(self, name: str) -> SimulatedProfile | RealProfile | None:
        for profile in (*self.simulated, *self.real):
            if profile.name == name:
                return profile
        return None


# --- validation helpers -------------------------------------------------------------------


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ProfileError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _check_keys(
    data: Mapping[str, Any], where: str, required: set[str], optional: set[str]
) -> None:
    check_keys(where, data, required | optional, error=ProfileError)
    for key in sorted(required):
        if key not in data:
            raise ProfileError(f"{where}.{key}: required key is missing")


def _number(value: Any, where: str, *, low: float = 0.0, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(f"{where}: expected a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or not low <= number <= high:
        raise ProfileError(f"{where}: {number} is outside [{low}, {high}]")
    return number


def _probability(value: Any, where: str) -> float:
    return _number(value, where, low=0.0, high=1.0)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ProfileError(f"{where}: expected a non-empty string, got {value!r}")
    return " ".join(value.split())


def _name(value: Any, where: str) -> str:
    name = _text(value, where)
    if not _NAME.match(name):
        raise ProfileError(
            f"{where}: {name!r} is not a valid worker name (lowercase letters, digits, . _ -)"
        )
    return name


def _skill(value: Any, where: str) -> dict[str, dict[str, float]]:
    domains = _mapping(value, where)
    if DEFAULT_DOMAIN not in domains:
        raise ProfileError(f"{where}.{DEFAULT_DOMAIN}: required key is missing")
    table: dict[str, dict[str, float]] = {}
    for domain, levels in domains.items():
        here = f"{where}.{domain}"
        if isinstance(levels, int | float) and not isinstance(levels, bool):
            table[str(domain)] = {DEFAULT_DIFFICULTY: _probability(levels, here)}
            continue
        levels = _mapping(levels, here)
        if not levels:
            raise ProfileError(f"{here}: needs at least one difficulty")
        table[str(domain)] = {
            str(level): _probability(p, f"{here}.{level}") for level, p in levels.items()
        }
    return table


def _simulated(data: Any, where: str) -> SimulatedProfile:
    data = _mapping(data, where)
    _check_keys(
        data,
        where,
        required={
            "name",
            "description",
            "input_cost_per_token",
            "output_cost_per_token",
            "latency",
            "verbosity",
            "skill",
            "verify_skill",
            "guess_rate",
        },
        optional={"timeout_s", "call_variation"},
    )
    name = _name(data["name"], f"{where}.name")
    if not name.startswith(SIM_PREFIX):
        raise ProfileError(f"{where}.name: simulated worker names start with {SIM_PREFIX!r}")
    latency = _mapping(data["latency"], f"{where}.latency")
    _check_keys(latency, f"{where}.latency", {"median_s"}, {"sigma", "per_output_token_s"})
    verbosity = _mapping(data["verbosity"], f"{where}.verbosity")
    _check_keys(verbosity, f"{where}.verbosity", {"mean_words"}, set())
    return SimulatedProfile(
        name=name,
        description=_text(data["description"], f"{where}.description"),
        input_cost_per_token=_number(data["input_cost_per_token"], f"{where}.input_cost_per_token"),
        output_cost_per_token=_number(
            data["output_cost_per_token"], f"{where}.output_cost_per_token"
        ),
        latency=Latency(
            median_s=_number(latency["median_s"], f"{where}.latency.median_s"),
            sigma=_number(latency.get("sigma", 0.0), f"{where}.latency.sigma", high=5.0),
            per_output_token_s=_number(
                latency.get("per_output_token_s", 0.0), f"{where}.latency.per_output_token_s"
            ),
        ),
        mean_words=_number(verbosity["mean_words"], f"{where}.verbosity.mean_words", high=5000),
        skill=_skill(data["skill"], f"{where}.skill"),
        verify_skill=_probability(data["verify_skill"], f"{where}.verify_skill"),
        guess_rate=_probability(data["guess_rate"], f"{where}.guess_rate"),
        timeout_s=_number(data.get("timeout_s", 60.0), f"{where}.timeout_s", low=0.001),
        call_variation=_probability(data.get("call_variation", 0.0), f"{where}.call_variation"),
    )


def _real(data: Any, where: str) -> RealProfile:
    data = _mapping(data, where)
    _check_keys(
        data,
        where,
        required={"name", "description", "input_cost_per_token", "output_cost_per_token"},
        optional={"model", "max_tokens", "timeout_s", "dtype"},
    )
    name = _name(data["name"], f"{where}.name")
    if name.startswith(SIM_PREFIX):
        raise ProfileError(f"{where}.name: {SIM_PREFIX!r} is reserved for simulated workers")
    model = _text(data.get("model", "smollm2-135m-instruct"), f"{where}.model")
    if model != "smollm2-135m-instruct":
        raise ProfileError(f"{where}.model: only 'smollm2-135m-instruct' is available offline")
    max_tokens = data.get("max_tokens", 96)
    check_int(max_tokens, f"{where}.max_tokens", minimum=1, error=ProfileError)
    dtype = data.get("dtype", "float32")
    if dtype not in MODEL_DTYPES:
        raise ProfileError(f"{where}.dtype: must be one of {MODEL_DTYPES}, got {dtype!r}")
    return RealProfile(
        name=name,
        description=_text(data["description"], f"{where}.description"),
        input_cost_per_token=_number(data["input_cost_per_token"], f"{where}.input_cost_per_token"),
        output_cost_per_token=_number(
            data["output_cost_per_token"], f"{where}.output_cost_per_token"
        ),
        model=model,
        max_tokens=max_tokens,
        timeout_s=_number(data.get("timeout_s", 120.0), f"{where}.timeout_s", low=0.001),
        dtype=dtype,
    )


def parse_profiles(data: Any, source: str = "sandbox profiles") -> SandboxProfiles:
    """Validate an already-loaded YAML document into :class:`SandboxProfiles`."""
    try:
        root = _mapping(data, source)
        _check_keys(root, source, {"simulated"}, {"real"})
        sims = root["simulated"]
        if not isinstance(sims, list) or not sims:
            raise ProfileError(f"{source}.simulated: expected a non-empty list")
        reals = root.get("real") or []
        if not isinstance(reals, list):
            raise ProfileError(f"{source}.real: expected a list")
        simulated = tuple(_simulated(item, f"simulated[{i}]") for i, item in enumerate(sims))
        real = tuple(_real(item, f"real[{i}]") for i, item in enumerate(reals))
    except ProfileError as exc:
        if str(exc).startswith(source):
            raise
        raise ProfileError(f"{source}: {exc}") from None
    seen: set[str] = set()
    for profile in (*simulated, *real):
        if profile.name in seen:
            raise ProfileError(f"{source}: worker name {profile.name!r} is declared twice")
        seen.add(profile.name)
    return SandboxProfiles(simulated=simulated, real=real)


def load_profiles(path: str | Path) -> SandboxProfiles:
    """Read and validate a sandbox profile YAML file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from None
    return parse_profiles(data, source=str(path))


def default_profiles_path() -> Path:
    """``conf/base/sandbox_workers.yml`` of the project this code runs in."""
    from conductor_pipeline.paths import find_project_root

    try:
        root = find_project_root()
    except RuntimeError as err:
        raise FileNotFoundError(f"{err} Or pass the sandbox profile file explicitly.") from err
    return root / "conf" / "base" / "sandbox_workers.yml"


def sandbox_pool_config(profiles: SandboxProfiles, api_base: str) -> list[dict[str, Any]]:
    """Worker entries of the pool for a sandbox server listening at ``api_base``.

    One entry per worker, simulated first, in file order, with ``name``, ``model``
    (``openai/<name>``), ``api_base``, ``description``, ``input_cost_per_token``,
    ``output_cost_per_token`` and ``timeout_s`` (the key ``workers/config.py`` reads);
    real workers add their ``max_tokens``. No api key: the server accepts any.
    """
    base = api_base.rstrip("/")
    entries: list[dict[str, Any]] = []
    for profile in (*profiles.simulated, *profiles.real):
        entry: dict[str, Any] = {
            "name": profile.name,
            "model": f"openai/{profile.name}",
            "api_base": base,
            "description": profile.description,
            "input_cost_per_token": profile.input_cost_per_token,
            "output_cost_per_token": profile.output_cost_per_token,
            "timeout_s": profile.timeout_s,
        }
        if isinstance(profile, RealProfile):
            entry["max_tokens"] = profile.max_tokens
        entries.append(entry)
    return entries
