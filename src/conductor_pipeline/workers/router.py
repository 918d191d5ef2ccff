"""The ``litellm.Router`` behind a ``WorkerPool``: one deployment per worker with its
per-worker retry policy (``num_retries`` for timeouts, rate limits and server errors; none
for bad requests or authentication errors) and its ``fallbacks``, and the process-wide
litellm logger that counts the failed attempts of each pool call."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from .config import WorkerSpec
from .faults import ProviderFaults

__all__ = ["CALL_ID", "attempt_counter", "build_router"]

# the ``metadata`` key under which a pool call tags its Router request for the counter
CALL_ID = "conductor_call_id"
_NO_KEY = "no-key"  # OpenAI-compatible local servers still want some bearer token


def build_router(
    specs: Sequence[WorkerSpec],
    provider_faults: ProviderFaults | None = None,
    router_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """A ``litellm.Router`` with one deployment per worker (named after it).
    ``provider_faults`` wraps every deployment; ``router_kwargs`` win over these choices."""
    import litellm
    from litellm.types.router import RetryPolicy

    model_list = []
    retry_policies = {}
    for spec in specs:
        params: dict[str, Any] = {
            "model": spec.model,
            "timeout": spec.timeout_s,
            "drop_params": True,
        }
        if spec.api_base:
            params["api_base"] = spec.api_base
        if spec.api_key:
            params["api_key"] = spec.api_key.get()
        elif spec.provider == "openai" and spec.api_base:
            params["api_key"] = _NO_KEY
        if provider_faults is not None:
            params = provider_faults.wrap(spec.name, params)
        model_list.append({"model_name": spec.name, "litellm_params": params})
        n = spec.num_retries
        retry_policies[spec.name] = RetryPolicy(
            TimeoutErrorRetries=n,
            RateLimitErrorRetries=n,
            InternalServerErrorRetries=n,
            ServiceUnavailableErrorRetries=n,
            DefaultRetries=n,
            BadRequestErrorRetries=0,
            AuthenticationErrorRetries=0,
            ContentPolicyViolationErrorRetries=0,
            NotFoundErrorRetries=0,
        )
    options: dict[str, Any] = {
        "model_list": model_list,
        "fallbacks": [{s.name: list(s.fallbacks)} for s in specs if s.fallbacks],
        "num_retries": 0,
        "model_group_retry_policy": retry_policies,
        "disable_cooldowns": True,
    }
    options.update(router_kwargs or {})
    return litellm.Router(**options)


_counter_lock = threading.Lock()
_counter: Any = None


def attempt_counter() -> Any:
    """The process-wide litellm logger that counts failed attempts per pool call.

    Each pool call tags its Router request with a fresh id in ``metadata``; litellm reports
    every failed attempt (retries and fallback hops included) to ``async_log_failure_event``
    before the Router moves on. One instance serves all pools: litellm de-duplicates loggers
    of the same class, so per-pool instances would silently not be registered.
    """
    global _counter
    import litellm
    from litellm.integrations.custom_logger import CustomLogger

    with _counter_lock:
        if _counter is None:

            class _AttemptCounter(CustomLogger):
                def __init__(self) -> None:
                    super().__init__()
                    self._failures: dict[str, int] = {}
                    self._lock = threading.Lock()

                async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
                    params = kwargs.get("litellm_params") or {}
                    metadata = params.get("metadata") or kwargs.get("metadata") or {}
                    call_id = metadata.get(CALL_ID) if isinstance(metadata, Mapping) else None
                    if call_id is None:
                        return
                    with self._lock:
                        if call_id in self._failures:
                            self._failures[call_id] += 1

                def open(self, call_id: str) -> None:
                    with self._lock:
                        self._failures[call_id] = 0

                def close(self, call_id: str) -> int:
                    with self._lock:
                        return self._failures.pop(call_id, 0)

            _counter = _AttemptCounter()
        # re-register if someone reset litellm's callback lists since
        if _counter not in litellm.callbacks:
            litellm.callbacks.append(_counter)
        return _counter
