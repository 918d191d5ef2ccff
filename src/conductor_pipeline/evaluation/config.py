"""Evaluation settings, read from the ``evaluation`` parameters and checked before any work.

``EvaluationConfig.from_params(params)`` raises ``ValueError`` naming the offending key
(``evaluation.moa.layers: must be a positive integer``). Layout (every key optional)::

    evaluation:
      seed: 0
      test_per_domain: 6          # null: the whole test split
      validation_per_domain: 4    # questions per domain the router (and handcrafted) pick on
      store: data/07_model_output/evaluation/results.jsonl
      concurrency: 8              # questions in flight for systems without a Conductor
      infra_retries: 3            # a worker call that failed for an infrastructure reason is
      retry_delay_s: 0.5          # asked again this often (delay doubling); see runner.py
      systems: [conductor, conductor+recursion, champion, warm-start, base-policy, solo, moa,
                random-workflow, best-of-n, router, handcrafted, oracle]
      policy_server: none         # vllm: launch serving.vllm with every adapter evaluated
      conductor: {adapter: null, max_parse_attempts: null, recursion_rounds: 1,
                  batch_size: 4, in_flight: 8}
      base_policy: {}             # keys overriding conductor.policy for the untrained model
      moa: {proposers: null, layers: 1, aggregator: random}
      random_workflow: {workers: null}
      best_of_n: {worker: auto, n: auto, max_n: 8}
      router: {workers: null}
      handcrafted: {solvers: auto, checker: auto}   # or solvers: {<domain>: <worker>, default: ...}
      metrics: {bootstrap_samples: 2000, confidence: 0.95}
      trace_sample: 5             # Conductor questions recorded as MLflow traces
      benchmarks: {}              # name -> loader options (tasks.sources): evaluate on these
                                  # instead of the prepared test split (full scale)
      report_by: domain           # per-group table by task domain or by source (benchmark)

The kinds ``systems`` may list, the sections ``moa``/``random_workflow``/``best_of_n``/
``router``/``handcrafted`` and their checks are declared by the kinds themselves
(:mod:`~conductor_pipeline.evaluation.kinds`); this module reads the registry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from conductor_pipeline.config_checks import check_int, check_keys

# importing kinds registers the built-in system kinds
from conductor_pipeline.evaluation import kinds as _kinds  # noqa: F401
from conductor_pipeline.evaluation.registry import KINDS, check_number, check_section

# the system *kinds* a config may list (registry order); solo and best-of-n expand per worker
SYSTEM_KINDS = tuple(KINDS)
# the systems that write workflows (a Conductor model, prompted alike); ``warm-start`` is the
# same training run's SFT-only adapter, evaluated when the Conductor under test carries one;
# ``champion`` is the registry's current champion, evaluated alongside a different candidate
# so that promotion compares two models measured on the same questions by the same server
CONDUCTOR_SYSTEMS = tuple(name for name, kind in KINDS.items() if kind.writes_workflows)
# how the evaluation reaches an ``endpoint`` Conductor: ``none`` uses conductor.policy as it
# is (whatever that server serves, so the rows are labelled with the endpoint, not with a
# registry version); ``vllm`` launches serving.vllm with each evaluated adapter as a named
# LoRA module and asks for each model by its served name
POLICY_SERVERS = ("none", "vllm")
# the keys every evaluation reads, besides the kinds' own sections
_GENERAL = {
    "policy_server",
    "benchmarks",
    "report_by",
    "seed",
    "test_per_domain",
    "validation_per_domain",
    "store",
    "concurrency",
    "infra_retries",
    "retry_delay_s",
    "systems",
    "conductor",
    "base_policy",
    "metrics",
    "trace_sample",
}
_DEFAULT_STORE = "data/07_model_output/evaluation/results.jsonl"

# Kept on dataclasses and the check_* helpers rather than pydantic models: the messages name
# the key as ``evaluation.<key>: must be ...`` (tests pin them), and pydantic's strict types,
# ``extra="forbid"`` and a translation of its ValidationError would take more lines than the
# checks they replace, with per-kind settings still needing their own models.


@dataclass(frozen=True)
class ConductorSettings:
    adapter: str | None = None  # None: conductor.policy.adapter
    max_parse_attempts: int | None = None  # None: conductor.max_parse_attempts
    recursion_rounds: int = 1
    batch_size: int = 4
    in_flight: int = 8


def _systems(value: Any) -> tuple[str, ...]:
    """The listed kinds, each known, each with the kind it needs listed as well."""
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise ValueError("evaluation.systems: must be a non-empty list of system kinds")
    bad = [s for s in value if s not in KINDS]
    if bad:
        raise ValueError(f"evaluation.systems: unknown {bad}; known: {list(KINDS)}")
    for name in value:
        needs = KINDS[name].needs
        if needs is not None and needs not in value:
            raise ValueError(f"evaluation.systems: {name} {KINDS[name].needs_reason}")
    return tuple(dict.fromkeys(value))


def _conductor(params: Mapping[str, Any]) -> ConductorSettings:
    section = check_section(params, "conductor", {f.name for f in fields(ConductorSettings)})
    adapter = section.get("adapter")
    if adapter is not None and not isinstance(adapter, str):
        raise ValueError(
            "evaluation.conductor.adapter: must be a path, a registry reference or null"
        )

    def positive(key: str, default: int | None) -> Any:
        return check_int(
            section.get(key, default),
            f"evaluation.conductor.{key}",
            minimum=1,
            allow_none=default is None,
        )

    return ConductorSettings(
        adapter=adapter,
        max_parse_attempts=positive("max_parse_attempts", None),
        recursion_rounds=positive("recursion_rounds", 1),
        batch_size=positive("batch_size", 4),
        in_flight=positive("in_flight", 8),
    )


def _kind_settings(params: Mapping[str, Any]) -> dict[str, Any]:
    """Every registered kind's section, parsed and checked whether or not it is listed."""
    out = {}
    for name, kind in KINDS.items():
        if kind.section is not None:
            allowed = {f.name for f in fields(kind.Settings)}
            out[name] = kind.parse(check_section(params, kind.section, allowed))
    return out


def _report_by(value: Any) -> str:
    if value not in ("domain", "source"):
        raise ValueError(f"evaluation.report_by: must be 'domain' or 'source', got {value!r}")
    return value


def _policy_server(value: Any) -> str:
    if value not in POLICY_SERVERS:
        raise ValueError(
            f"evaluation.policy_server: must be one of {list(POLICY_SERVERS)}, got {value!r}"
        )
    return value


def _mappings(params: Mapping[str, Any]) -> dict[str, Any]:
    """``base_policy`` (overrides of conductor.policy) and ``benchmarks`` (loader options)."""
    base_policy = params.get("base_policy") or {}
    if not isinstance(base_policy, Mapping):
        raise ValueError(
            "evaluation.base_policy: must be a mapping (overrides of conductor.policy)"
        )
    benchmarks = params.get("benchmarks") or {}
    if not isinstance(benchmarks, Mapping):
        raise ValueError("evaluation.benchmarks: must map benchmark names to loader options")
    for name, options in benchmarks.items():
        if options is not None and not isinstance(options, Mapping):
            raise ValueError(f"evaluation.benchmarks.{name}: options must be a mapping")
    return {
        "base_policy": dict(base_policy),
        "benchmarks": {str(k): dict(v or {}) for k, v in benchmarks.items()},
    }


def _scalars(params: Mapping[str, Any]) -> dict[str, Any]:
    """The single-valued settings, checked."""
    store = params.get("store", _DEFAULT_STORE)
    if not isinstance(store, str) or not store:
        raise ValueError("evaluation.store: must be a file path")
    metrics = check_section(params, "metrics", {"bootstrap_samples", "confidence"})
    per_domain = {
        key: check_int(params.get(key, default), f"evaluation.{key}", minimum=1, allow_none=True)
        for key, default in (("test_per_domain", 6), ("validation_per_domain", 4))
    }
    return {
        **per_domain,
        "seed": check_int(params.get("seed", 0), "evaluation.seed"),
        "store": store,
        "concurrency": check_int(params.get("concurrency", 8), "evaluation.concurrency", minimum=1),
        "infra_retries": check_int(params.get("infra_retries", 3), "evaluation.infra_retries"),
        "retry_delay_s": check_number(params.get("retry_delay_s", 0.5), "retry_delay_s", 0, 60),
        "bootstrap_samples": check_int(
            metrics.get("bootstrap_samples", 2000),
            "evaluation.metrics.bootstrap_samples",
            minimum=100,
        ),
        "confidence": check_number(metrics.get("confidence", 0.95), "metrics.confidence", 0.5, 1),
        "trace_sample": check_int(params.get("trace_sample", 5), "evaluation.trace_sample"),
    }


@dataclass(frozen=True)
class EvaluationConfig:
    seed: int = 0
    test_per_domain: int | None = 6
    validation_per_domain: int | None = 4
    store: str = _DEFAULT_STORE
    concurrency: int = 8
    infra_retries: int = 3
    retry_delay_s: float = 0.5
    systems: tuple[str, ...] = SYSTEM_KINDS
    conductor: ConductorSettings = field(default_factory=ConductorSettings)
    base_policy: dict[str, Any] = field(default_factory=dict)
    # registered kind name -> its parsed settings (a kind absent here has its defaults)
    kind_settings: dict[str, Any] = field(default_factory=dict)
    bootstrap_samples: int = 2000
    confidence: float = 0.95
    trace_sample: int = 5
    benchmarks: dict[str, dict[str, Any]] = field(default_factory=dict)
    report_by: str = "domain"
    policy_server: str = "none"

    def wants(self, kind: str) -> bool:
        return kind in self.systems

    def settings_of(self, kind: str) -> Any:
        """The settings of a registered kind (``None`` for a kind without a section)."""
        if kind in self.kind_settings:
            return self.kind_settings[kind]
        declared = KINDS[kind]
        return declared.parse({}) if declared.section is not None else None

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None) -> EvaluationConfig:
        params = dict(params or {})
        top = _GENERAL | {k.section for k in KINDS.values() if k.section is not None}
        check_keys("evaluation", params, top)
        return cls(
            systems=_systems(params.get("systems", list(KINDS))),
            conductor=_conductor(params),
            kind_settings=_kind_settings(params),
            **_mappings(params),
            **_scalars(params),
            report_by=_report_by(params.get("report_by", "domain")),
            policy_server=_policy_server(params.get("policy_server") or "none"),
        )
