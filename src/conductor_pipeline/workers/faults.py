"""Deterministic fault injection for tests and the reliability benchmark.

Two levels:

- ``FaultInjector`` wraps any ``WorkerCaller`` (a ``WorkerPool`` included). With the configured
  probability per ``FailureKind`` it returns a typed failure *instead of* calling through, so
  the executor and the reward masking can be exercised without any server.
- ``ProviderFaults`` injects faults *below* the litellm Router, one draw per attempt. A pool
  built with ``WorkerPool(..., provider_faults=ProviderFaults(...))`` routes each deployment
  through a small litellm custom provider (``conductorfaults/...``) that raises
  ``litellm.Timeout`` / ``RateLimitError`` / ``InternalServerError`` or blanks the reply, and
  otherwise forwards the attempt to the real deployment with ``litellm.acompletion``. The
  Router sees real exceptions, so its retries and fallbacks really run.

Draws are a hash of (seed, worker, messages, sample index or attempt number), not a shared
random stream, so results do not depend on how concurrent calls interleave.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections import Counter
from collections.abc import Mapping
from typing import Any

from .types import FailureKind, Usage, WorkerReply

__all__ = ["FaultInjector", "ProviderFaults", "parse_fault_rates"]


def parse_fault_rates(rates: Mapping[str | FailureKind, float]) -> dict[FailureKind, float]:
    """``{"timeout": 0.05, ...}`` as ``{FailureKind.TIMEOUT: 0.05, ...}``; checks the values."""
    parsed: dict[FailureKind, float] = {}
    for key, value in rates.items():
        try:
            kind = FailureKind(key)
        except ValueError:
            allowed = ", ".join(k.value for k in FailureKind)
            raise ValueError(f"unknown failure kind {key!r} (allowed: {allowed})") from None
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise ValueError(f"fault rate for {kind.value!r} must be in [0, 1], got {value!r}")
        parsed[kind] = float(value)
    if sum(parsed.values()) > 1 + 1e-9:
        raise ValueError(f"fault rates add up to more than 1: {sum(parsed.values())}")
    return parsed


def _unit_draw(*parts: Any) -> float:
    """A number in [0, 1) determined by ``parts``."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _pick(rates: Mapping[FailureKind, float], draw: float) -> FailureKind | None:
    edge = 0.0
    for kind in FailureKind:  # fixed order, so a seed means the same thing everywhere
        edge += rates.get(kind, 0.0)
        if draw < edge:
            return kind
    return None


class FaultInjector:
    """A ``WorkerCaller`` that fails some calls on purpose and passes the rest to ``inner``.

    ``rates`` maps failure kinds (names or ``FailureKind``) to probabilities; ``seed`` fixes
    the outcome of each (worker, messages, sample_index, n-th repetition) so a run is
    reproducible. An injected failure carries ``latency_s[kind]`` (default 0) as its latency;
    with ``sleep=True`` the injector also waits that long.
    """

    def __init__(
        self,
        inner: Any,
        rates: Mapping[str | FailureKind, float],
        *,
        seed: int = 0,
        latency_s: Mapping[str | FailureKind, float] | None = None,
        sleep: bool = False,
    ) -> None:
        self.inner = inner
        self.rates = parse_fault_rates(rates)
        self.seed = seed
        self.latency_s = {FailureKind(k): float(v) for k, v in (latency_s or {}).items()}
        self.sleep = sleep
        self._seen: Counter[str] = Counter()
        self.injected: Counter[FailureKind] = Counter()
        self.passed = 0

    def _name(self, worker: int | str) -> str:
        names = getattr(self.inner, "names", None)
        if isinstance(worker, int) and names is not None and 0 <= worker < len(names):
            return names[worker]
        return str(worker)

    async def __call__(
        self,
        worker: int | str,
        messages: list[dict[str, str]],
        sample_index: int = 0,
        **overrides: Any,
    ) -> WorkerReply:
        name = self._name(worker)
        request = json.dumps([name, messages, sample_index], sort_keys=True, default=str)
        repeat = self._seen[request]
        self._seen[request] += 1
        kind = _pick(self.rates, _unit_draw("above", self.seed, request, repeat))
        if kind is None:
            self.passed += 1
            return await self.inner(worker, messages, sample_index, **overrides)
        self.injected[kind] += 1
        latency = self.latency_s.get(kind, 0.0)
        if self.sleep and latency > 0:
            import asyncio

            await asyncio.sleep(latency)
        return WorkerReply(
            worker=name,
            text=None,
            usage=Usage(latency_s=latency),
            failure=kind,
            error=f"injected {kind.value}",
            attempts=1,
        )

    call = __call__

    @property
    def stats(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "injected": {kind.value: n for kind, n in self.injected.items()},
        }


# --- below the router ------------------------------------------------------------------------

PROVIDER_NAME = "conductorfaults"
_registry: dict[str, tuple[ProviderFaults, str, dict[str, Any]]] = {}
_registry_lock = threading.Lock()
_handler: Any = None


def _ensure_provider_registered() -> None:
    """Register the custom litellm provider once per process."""
    global _handler
    import litellm
    from litellm import CustomLLM

    with _registry_lock:
        if _handler is not None and any(
            item.get("provider") == PROVIDER_NAME for item in litellm.custom_provider_map
        ):
            return

        class _FaultProvider(CustomLLM):
            async def acompletion(  # type: ignore[override]
                self,
                model: str,
                messages: list,
                *args: Any,
                optional_params: dict | None = None,
                timeout: Any = None,
                **kwargs: Any,
            ) -> Any:
                with _registry_lock:
                    entry = _registry.get(model)
                if entry is None:
                    raise litellm.APIConnectionError(
                        message=f"no fault-injected deployment {model!r}",
                        llm_provider=PROVIDER_NAME,
                        model=model,
                    )
                faults, name, inner = entry
                return await faults._attempt(name, inner, messages, optional_params or {}, timeout)

            def completion(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover
                raise litellm.APIConnectionError(
                    message="fault-injected deployments are async only",
                    llm_provider=PROVIDER_NAME,
                    model="",
                )

        _handler = _FaultProvider()
        litellm.custom_provider_map = [
            item for item in litellm.custom_provider_map if item.get("provider") != PROVIDER_NAME
        ] + [{"provider": PROVIDER_NAME, "custom_handler": _handler}]
        # litellm reads the map into its provider list when a call starts; do it now too.
        from litellm.utils import custom_llm_setup

        custom_llm_setup()


class ProviderFaults:
    """Per-attempt faults under the litellm Router (see the module docstring).

    Supported kinds: timeout, rate_limit, provider_error (raised as litellm exceptions, so
    the Router retries and falls back) and empty_reply (the real reply with its content
    blanked; the Router does not retry it, the pool reports ``EMPTY_REPLY``).
    ``attempts`` and ``injected`` count what happened.
    """

    SUPPORTED = frozenset(
        {
            FailureKind.TIMEOUT,
            FailureKind.RATE_LIMIT,
            FailureKind.PROVIDER_ERROR,
            FailureKind.EMPTY_REPLY,
        }
    )

    def __init__(self, rates: Mapping[str | FailureKind, float], *, seed: int = 0) -> None:
        self.rates = parse_fault_rates(rates)
        unsupported = sorted(
            k.value for k, v in self.rates.items() if v and k not in self.SUPPORTED
        )
        if unsupported:
            raise ValueError(f"ProviderFaults cannot inject {unsupported} below the router")
        self.seed = seed
        self._seen: Counter[str] = Counter()
        self.attempts: Counter[str] = Counter()
        self.injected: Counter[FailureKind] = Counter()
        self._aliases: list[str] = []

    def wrap(self, name: str, litellm_params: Mapping[str, Any]) -> dict[str, Any]:
        """Deployment params that reach ``litellm_params`` through the fault provider."""
        _ensure_provider_registered()
        alias = f"{uuid.uuid4().hex[:10]}-{name}"
        inner = dict(litellm_params)
        outer = {"model": f"{PROVIDER_NAME}/{alias}"}
        if "timeout" in inner:
            outer["timeout"] = inner["timeout"]
        with _registry_lock:
            _registry[alias] = (self, name, inner)
        self._aliases.append(alias)
        return outer

    def release(self) -> None:
        """Forget the deployments this object wrapped (the pool calls it on close)."""
        with _registry_lock:
            for alias in self._aliases:
                _registry.pop(alias, None)
        self._aliases.clear()

    async def _attempt(
        self,
        name: str,
        inner: Mapping[str, Any],
        messages: list,
        optional_params: Mapping[str, Any],
        timeout: Any,
    ) -> Any:
        import litellm

        request = json.dumps([name, messages], sort_keys=True, default=str)
        repeat = self._seen[request]
        self._seen[request] += 1
        self.attempts[name] += 1
        kind = _pick(self.rates, _unit_draw("below", self.seed, request, repeat))
        model = str(inner.get("model", name))
        if kind is not None:
            self.injected[kind] += 1
        if kind is FailureKind.TIMEOUT:
            raise litellm.Timeout(
                message="injected timeout", model=model, llm_provider=PROVIDER_NAME
            )
        if kind is FailureKind.RATE_LIMIT:
            raise litellm.RateLimitError(
                message="injected rate limit", model=model, llm_provider=PROVIDER_NAME
            )
        if kind is FailureKind.PROVIDER_ERROR:
            raise litellm.InternalServerError(
                message="injected provider error", model=model, llm_provider=PROVIDER_NAME
            )
        params = {k: v for k, v in optional_params.items() if k != "stream"}
        params.setdefault("max_retries", 0)
        if timeout is not None:
            params["timeout"] = timeout
        response = await litellm.acompletion(messages=messages, **{**inner, **params})
        if kind is FailureKind.EMPTY_REPLY:
            for choice in response.choices:
                choice.message.content = ""
        return response

    @property
    def stats(self) -> dict[str, Any]:
        return {
            "attempts": dict(self.attempts),
            "injected": {kind.value: n for kind, n in self.injected.items()},
        }
