"""The ``serving`` parameters (``conf/*/parameters_serving.yml``), validated.

::

    serving:
      host: 127.0.0.1
      port: 8700
      model: null                 # registry reference; null: conductor.policy.adapter if it resolves
      policy_server: local        # local: conductor.policy in this process | vllm: launch vLLM
      max_concurrency: 32         # requests orchestrated at once; more are refused with 429
      retry_after_s: 1            # the Retry-After header of a 429
      request_timeout_s: 300      # per request, Conductor and workers together (504 after)
      shutdown_grace_s: 30        # how long SIGTERM waits for requests in flight
      max_body_bytes: 262144      # larger bodies: 413
      max_question_chars: 8000    # the last user message; longer: 400
      max_context_chars: 4000     # earlier turns kept (most recent first) as context
      require_api_key: false      # refuse to start without CONDUCTOR_API_KEY / conductor_api_key
      tracing: false              # an MLflow trace per request
      tracing_experiment: conductor-serving
      warm_up: true               # at start-up: cache the prompt opening, one short generation
      torch_threads: null         # a local Conductor's CPU threads; null: every core
      dtype: auto                 # a local Conductor's precision: auto | float32 | bfloat16
      limits: {max_steps: 10, max_tokens: null, max_cost_usd: null, max_rounds: 2}
      batching: {enabled: true, max_batch: 16, max_wait_ms: 200}   # see serving.batching
      capture: {enabled: false, ...}   # opt-in request capture, see serving.capture
      vllm: {...}                 # see conductor_pipeline.serving.policy_server.VllmSettings

``limits`` are ceilings for the per-request budget fields; a request may ask for less than
the defaults (``conductor.budget``, ``conductor.max_rounds``) or more, up to the ceiling.
Every error names the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from conductor_pipeline.config_checks import check_int, check_keys
from conductor_pipeline.serving.batching import BatchingSettings
from conductor_pipeline.serving.capture import CaptureSettings
from conductor_pipeline.serving.policy_server import VllmSettings
from conductor_pipeline.workers.local_model import MODEL_DTYPES

POLICY_SERVERS = ("local", "vllm")
_LIMIT_KEYS = ("max_steps", "max_tokens", "max_cost_usd", "max_rounds")


@dataclass(frozen=True)
class RequestLimits:
    """Ceilings for per-request budgets; ``None`` means no ceiling."""

    max_steps: int | None = 10
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_rounds: int | None = 2


@dataclass
class ServingSettings:
    host: str = "127.0.0.1"
    port: int = 8700
    model: str | None = None
    policy_server: str = "local"
    max_concurrency: int = 32
    retry_after_s: int = 1
    request_timeout_s: float = 300.0
    shutdown_grace_s: float = 30.0
    max_body_bytes: int = 262_144
    max_question_chars: int = 8000
    max_context_chars: int = 4000
    require_api_key: bool = False
    tracing: bool = False
    tracing_experiment: str = "conductor-serving"
    warm_up: bool = True
    torch_threads: int | None = None
    dtype: str = "auto"
    limits: RequestLimits = field(default_factory=RequestLimits)
    batching: BatchingSettings = field(default_factory=BatchingSettings)
    vllm: VllmSettings = field(default_factory=VllmSettings)
    capture: CaptureSettings = field(default_factory=CaptureSettings)

    def __post_init__(self) -> None:
        if self.policy_server not in POLICY_SERVERS:
            raise ValueError(
                f"serving.policy_server: must be one of {POLICY_SERVERS}, got {self.policy_server!r}"
            )
        for name in ("max_concurrency", "max_body_bytes", "max_question_chars"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"serving.{name}: must be at least 1, got {getattr(self, name)!r}")
        for name in ("request_timeout_s", "shutdown_grace_s"):
            if float(getattr(self, name)) <= 0:
                raise ValueError(f"serving.{name}: must be positive, got {getattr(self, name)!r}")
        if not isinstance(self.warm_up, bool):
            raise ValueError(f"serving.warm_up: must be true or false, got {self.warm_up!r}")
        check_int(self.torch_threads, "serving.torch_threads", minimum=1, allow_none=True)
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(f"serving.dtype: must be one of {MODEL_DTYPES}, got {self.dtype!r}")
        if self.max_context_chars < 0 or self.retry_after_s < 0:
            raise ValueError("serving.max_context_chars and serving.retry_after_s must be >= 0")
        if not 0 <= int(self.port) <= 65535:
            raise ValueError(f"serving.port: not a TCP port: {self.port!r}")


def serving_settings(params: Mapping[str, Any] | None) -> ServingSettings:
    """``ServingSettings`` from the ``serving`` mapping; unknown keys and bad values raise
    ``ValueError`` naming the key."""
    params = dict(params or {})
    check_keys("serving", params, (f.name for f in fields(ServingSettings)))
    limits = params.pop("limits", None) or {}
    if not isinstance(limits, Mapping):
        raise ValueError("serving.limits: must be a mapping")
    check_keys("serving.limits", limits, _LIMIT_KEYS)
    for key, value in limits.items():
        if value is not None and (isinstance(value, bool) or float(value) < 0):
            raise ValueError(f"serving.limits.{key}: must be >= 0 or null, got {value!r}")
    vllm = VllmSettings.from_mapping(params.pop("vllm", None) or {})
    batching = params.pop("batching", None) or {}
    if not isinstance(batching, Mapping):
        raise ValueError("serving.batching: must be a mapping")
    batching = BatchingSettings.from_mapping(batching)
    capture = params.pop("capture", None) or {}
    if not isinstance(capture, Mapping):
        raise ValueError("serving.capture: must be a mapping")
    capture = CaptureSettings.from_mapping(capture)
    try:
        return ServingSettings(
            **params,
            limits=RequestLimits(**limits),
            vllm=vllm,
            batching=batching,
            capture=capture,
        )
    except TypeError as err:
        raise ValueError(f"serving: {err}") from err
