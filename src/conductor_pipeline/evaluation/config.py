"""Evaluation settings, read from the ``evaluation`` parameters and checked before any work.

``EvaluationConfig.from_params(params)`` raises ``ValueError`` naming the offending key
(``evaluation.moa.layers: must be a positive integer``). Layout (every key optional)::

    evaluation:
      seed: 0
      test_per_domain: 6          # null: the whole test split
      validation_per_domain: 4    # questions per domain the router is fitted on
      store: data/07_model_output/evaluation/results.jsonl
      concurrency: 8              # questions in flight for systems without a Conductor
      infra_retries: 3            # a worker call that failed for an infrastructure reason is
      retry_delay_s: 0.5          # asked again this often (delay doubling); see runner.py
      systems: [conductor, conductor+recursion, champion, warm-start, base-policy, solo, moa,
                random-workflow, best-of-n, router, oracle]
      policy_server: none         # vllm: launch serving.vllm with every adapter evaluated
      conductor: {adapter: null, max_parse_attempts: null, recursion_rounds: 1,
                  batch_size: 4, in_flight: 8}
      base_policy: {}             # keys overriding conductor.policy for the untrained model
      moa: {proposers: null, layers: 1, aggregator: random}
      random_workflow: {workers: null}
      best_of_n: {worker: auto, n: auto, max_n: 8}
      router: {workers: null}
      metrics: {bootstrap_samples: 2000, confidence: 0.95}
      trace_sample: 5             # Conductor questions recorded as MLflow traces
      benchmarks: {}              # name -> loader options (tasks.sources): evaluate on these
                                  # instead of the prepared test split (full scale)
      report_by: domain           # per-group table by task domain or by source (benchmark)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# the system *kinds* a config may list; solo and best-of-n expand per worker
SYSTEM_KINDS = (
    "conductor",
    "conductor+recursion",
    "champion",
    "warm-start",
    "base-policy",
    "solo",
    "moa",
    "random-workflow",
    "best-of-n",
    "router",
    "oracle",
)
# the systems that write workflows (a Conductor model, prompted alike); ``warm-start`` is the
# same training run's SFT-only adapter, evaluated when the Conductor under test carries one;
# ``champion`` is the registry's current champion, evaluated alongside a different candidate
# so that promotion compares two models measured on the same questions by the same server
CONDUCTOR_SYSTEMS = ("conductor", "conductor+recursion", "champion", "warm-start", "base-policy")
# how the evaluation reaches an ``endpoint`` Conductor: ``none`` uses conductor.policy as it
# is (whatever that server serves, so the rows are labelled with the endpoint, not with a
# registry version); ``vllm`` launches serving.vllm with each evaluated adapter as a named
# LoRA module and asks for each model by its served name
POLICY_SERVERS = ("none", "vllm")


def _int(value: Any, key: str, *, minimum: int = 0, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(
            f"evaluation.{key}: must be {kind}{' or null' if allow_none else ''}, got {value!r}"
        )
    return value


def _number(value: Any, key: str, low: float, high: float) -> float:
    """``value`` as a float in ``[low, high)``; a ``ValueError`` naming ``key`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value < high:
        raise ValueError(f"evaluation.{key}: must be in [{low:g}, {high:g}), got {value!r}")
    return float(value)


def _names(value: Any, key: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise ValueError(f"evaluation.{key}: must be a non-empty list of worker names or null")
    return [str(v) for v in value]


def _section(params: Mapping[str, Any], name: str, allowed: set[str]) -> dict[str, Any]:
    section = params.get(name) or {}
    if not isinstance(section, Mapping):
        raise ValueError(f"evaluation.{name}: must be a mapping")
    unknown = set(section) - allowed
    if unknown:
        raise ValueError(
            f"evaluation.{name}: unknown key(s) {sorted(unknown)}; expected {sorted(allowed)}"
        )
    return dict(section)


@dataclass(frozen=True)
class ConductorSettings:
    adapter: str | None = None  # None: conductor.policy.adapter
    max_parse_attempts: int | None = None  # None: conductor.max_parse_attempts
    recursion_rounds: int = 1
    batch_size: int = 4
    in_flight: int = 8


@dataclass(frozen=True)
class MoASettings:
    proposers: list[str] | None = None  # None: every worker
    layers: int = 1
    aggregator: str = "random"  # "random" (seeded per question, among the proposers) or a name


@dataclass(frozen=True)
class BestOfNSettings:
    worker: str = "auto"  # auto: the most expensive worker (by its prices)
    n: int | str = "auto"  # auto: matched to the Conductor's mean cost per question
    max_n: int = 8


@dataclass(frozen=True)
class EvaluationConfig:
    seed: int = 0
    test_per_domain: int | None = 6
    validation_per_domain: int | None = 4
    store: str = "data/07_model_output/evaluation/results.jsonl"
    concurrency: int = 8
    infra_retries: int = 3
    retry_delay_s: float = 0.5
    systems: tuple[str, ...] = SYSTEM_KINDS
    conductor: ConductorSettings = field(default_factory=ConductorSettings)
    base_policy: dict[str, Any] = field(default_factory=dict)
    moa: MoASettings = field(default_factory=MoASettings)
    random_workflow_workers: list[str] | None = None
    best_of_n: BestOfNSettings = field(default_factory=BestOfNSettings)
    router_workers: list[str] | None = None
    bootstrap_samples: int = 2000
    confidence: float = 0.95
    trace_sample: int = 5
    benchmarks: dict[str, dict[str, Any]] = field(default_factory=dict)
    report_by: str = "domain"
    policy_server: str = "none"

    _TOP = {
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
        "moa",
        "random_workflow",
        "best_of_n",
        "router",
        "metrics",
        "trace_sample",
    }

    def wants(self, kind: str) -> bool:
        return kind in self.systems

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None) -> EvaluationConfig:
        params = dict(params or {})
        unknown = set(params) - cls._TOP
        if unknown:
            raise ValueError(
                f"evaluation: unknown key(s) {sorted(unknown)}; expected {sorted(cls._TOP)}"
            )
        systems = params.get("systems", list(SYSTEM_KINDS))
        if isinstance(systems, str) or not isinstance(systems, Sequence) or not systems:
            raise ValueError("evaluation.systems: must be a non-empty list of system kinds")
        bad = [s for s in systems if s not in SYSTEM_KINDS]
        if bad:
            raise ValueError(f"evaluation.systems: unknown {bad}; known: {list(SYSTEM_KINDS)}")
        if "conductor+recursion" in systems and "conductor" not in systems:
            raise ValueError("evaluation.systems: conductor+recursion needs conductor as well")
        for dependent in ("random-workflow", "best-of-n"):
            if dependent in systems and "conductor" not in systems:
                raise ValueError(
                    f"evaluation.systems: {dependent} is sized from the conductor's results; "
                    "list conductor as well"
                )
        for derived in ("router", "oracle"):
            if derived in systems and "solo" not in systems:
                raise ValueError(
                    f"evaluation.systems: {derived} is derived from the solo results; list solo as well"
                )

        conductor = _section(
            params,
            "conductor",
            {"adapter", "max_parse_attempts", "recursion_rounds", "batch_size", "in_flight"},
        )
        adapter = conductor.get("adapter")
        if adapter is not None and not isinstance(adapter, str):
            raise ValueError(
                "evaluation.conductor.adapter: must be a path, a registry reference or null"
            )
        moa = _section(params, "moa", {"proposers", "layers", "aggregator"})
        rw = _section(params, "random_workflow", {"workers"})
        bon = _section(params, "best_of_n", {"worker", "n", "max_n"})
        router = _section(params, "router", {"workers"})
        metrics = _section(params, "metrics", {"bootstrap_samples", "confidence"})
        base_policy = params.get("base_policy") or {}
        if not isinstance(base_policy, Mapping):
            raise ValueError(
                "evaluation.base_policy: must be a mapping (overrides of conductor.policy)"
            )
        n = bon.get("n", "auto")
        if n != "auto":
            _int(n, "best_of_n.n", minimum=1)
        confidence = _number(metrics.get("confidence", 0.95), "metrics.confidence", 0.5, 1)
        aggregator = moa.get("aggregator", "random")
        if not isinstance(aggregator, str) or not aggregator:
            raise ValueError("evaluation.moa.aggregator: must be 'random' or a worker name")
        benchmarks = params.get("benchmarks") or {}
        if not isinstance(benchmarks, Mapping):
            raise ValueError("evaluation.benchmarks: must map benchmark names to loader options")
        for name, options in benchmarks.items():
            if options is not None and not isinstance(options, Mapping):
                raise ValueError(f"evaluation.benchmarks.{name}: options must be a mapping")
        report_by = params.get("report_by", "domain")
        if report_by not in ("domain", "source"):
            raise ValueError(
                f"evaluation.report_by: must be 'domain' or 'source', got {report_by!r}"
            )
        policy_server = params.get("policy_server") or "none"
        if policy_server not in POLICY_SERVERS:
            raise ValueError(
                f"evaluation.policy_server: must be one of {list(POLICY_SERVERS)}, "
                f"got {policy_server!r}"
            )
        store = params.get("store", cls.store)
        if not isinstance(store, str) or not store:
            raise ValueError("evaluation.store: must be a file path")
        return cls(
            seed=_int(params.get("seed", 0), "seed"),
            test_per_domain=_int(
                params.get("test_per_domain", 6), "test_per_domain", minimum=1, allow_none=True
            ),
            validation_per_domain=_int(
                params.get("validation_per_domain", 4),
                "validation_per_domain",
                minimum=1,
                allow_none=True,
            ),
            store=store,
            concurrency=_int(params.get("concurrency", 8), "concurrency", minimum=1),
            infra_retries=_int(params.get("infra_retries", 3), "infra_retries"),
            retry_delay_s=_number(params.get("retry_delay_s", 0.5), "retry_delay_s", 0, 60),
            systems=tuple(dict.fromkeys(systems)),
            conductor=ConductorSettings(
                adapter=adapter,
                max_parse_attempts=_int(
                    conductor.get("max_parse_attempts"),
                    "conductor.max_parse_attempts",
                    minimum=1,
                    allow_none=True,
                ),
                recursion_rounds=_int(
                    conductor.get("recursion_rounds", 1), "conductor.recursion_rounds", minimum=1
                ),
                batch_size=_int(conductor.get("batch_size", 4), "conductor.batch_size", minimum=1),
                in_flight=_int(conductor.get("in_flight", 8), "conductor.in_flight", minimum=1),
            ),
            base_policy=dict(base_policy),
            moa=MoASettings(
                proposers=_names(moa.get("proposers"), "moa.proposers"),
                layers=_int(moa.get("layers", 1), "moa.layers", minimum=1),
                aggregator=aggregator,
            ),
            random_workflow_workers=_names(rw.get("workers"), "random_workflow.workers"),
            best_of_n=BestOfNSettings(
                worker=str(bon.get("worker", "auto")),
                n=n,
                max_n=_int(bon.get("max_n", 8), "best_of_n.max_n", minimum=1),
            ),
            router_workers=_names(router.get("workers"), "router.workers"),
            bootstrap_samples=_int(
                metrics.get("bootstrap_samples", 2000), "metrics.bootstrap_samples", minimum=100
            ),
            confidence=confidence,
            trace_sample=_int(params.get("trace_sample", 5), "trace_sample"),
            benchmarks={str(k): dict(v or {}) for k, v in benchmarks.items()},
            report_by=report_by,
            policy_server=policy_server,
        )
