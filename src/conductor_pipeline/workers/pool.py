"""The worker pool: every worker LLM behind one ``litellm.Router``.

``WorkerPool.call(worker, messages, sample_index=0, **overrides)`` never raises for a
provider problem: it returns a ``WorkerReply`` with either text or a typed ``FailureKind``,
always with usage (tokens, dollars, latency) and the number of attempts the Router made.

Per call:

1. the response cache is consulted (a hit costs nothing and reports ``cache_hit=True``,
   ``attempts=0`` and the original token counts with ``cost_usd=0``; in ``read_only`` mode
   a miss is a ``PROVIDER_ERROR`` failure and no worker is called);
2. the Router is called under the worker's concurrency limit (``max_concurrency``), with its
   per-worker retry policy (``num_retries`` for timeouts, rate limits and server errors; none
   for bad requests or authentication errors) and the configured ``fallbacks``;
3. tokens come from the response's ``usage`` (``litellm.token_counter`` when absent) and
   dollars from the answering worker's configured prices, else from
   ``litellm.completion_cost`` (0 with ``cost_source="unknown"`` when litellm has no price);
4. exceptions become failures: ``litellm.Timeout`` -> TIMEOUT, ``RateLimitError`` ->
   RATE_LIMIT, anything else from the provider -> PROVIDER_ERROR; an empty reply is
   EMPTY_REPLY and a reply that is not text MALFORMED_REPLY;
5. successful replies are written to the cache and every call appends a ``UsageRecord``.

Configured API keys are replaced by ``***`` in every error message and record.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .cache import ResponseCache, cache_key
from .config import WorkerSpec, load_worker_specs
from .faults import ProviderFaults
from .responses import (
    attempts_floor,
    failure_kind,
    reply_content,
    reply_cost,
    reply_tokens,
    router_headers,
)
from .router import CALL_ID, attempt_counter, build_router
from .types import FailureKind, Usage, WorkerReply
from .usage import UsageRecord, usage_summary

__all__ = ["READ_ONLY_MISS", "WorkerPool"]

log = logging.getLogger(__name__)

_RESERVED_OVERRIDES = frozenset({"model", "messages", "api_key", "api_base", "metadata", "stream"})
# call options that do not change what a worker answers, so they stay out of the cache key
_NOT_IN_KEY = frozenset({"timeout", "num_retries", "max_retries"})
READ_ONLY_MISS = "cache miss in read_only mode"


class WorkerPool:
    """Workers reachable through litellm, numbered in configuration order.

    ``cache`` is a ``ResponseCache`` (not closed by the pool), a path (the pool opens a
    ``read_write`` cache there and closes it in ``aclose``) or None. ``usage_log_path``
    appends each ``UsageRecord`` as a JSON line; ``usage_log`` keeps the latest
    ``usage_log_keep`` in memory (a server makes calls without end). ``provider_faults``
    routes every deployment through ``ProviderFaults`` (tests, reliability benchmark).
    ``router_kwargs`` are passed to ``litellm.Router`` and win over the pool's choices
    (``disable_cooldowns=True``: a worker is one deployment, so a cooldown could only turn
    one failure into many).
    """

    def __init__(
        self,
        specs: Sequence[WorkerSpec],
        *,
        cache: ResponseCache | str | Path | None = None,
        usage_log_path: str | Path | None = None,
        usage_log_keep: int = 10_000,
        provider_faults: ProviderFaults | None = None,
        router_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not specs:
            raise ValueError("a WorkerPool needs at least one worker")
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError("worker names must be unique")
        self._specs = list(specs)
        self._by_name = {spec.name: spec for spec in self._specs}
        for spec in self._specs:
            missing = [f for f in spec.fallbacks if f not in self._by_name]
            if missing:
                raise ValueError(f"worker {spec.name!r} falls back to unknown {missing[0]!r}")
        self._secrets = sorted(
            {spec.api_key.get() for spec in self._specs if spec.api_key and spec.api_key.get()},
            key=len,
            reverse=True,
        )
        self._owns_cache = isinstance(cache, str | Path)
        self.cache = ResponseCache(cache) if isinstance(cache, str | Path) else cache
        self.usage_log_path = Path(usage_log_path) if usage_log_path else None
        if self.usage_log_path:
            self.usage_log_path.parent.mkdir(parents=True, exist_ok=True)
        self.usage_log: deque[UsageRecord] = deque(maxlen=usage_log_keep)
        self._provider_faults = provider_faults
        self._semaphores: weakref.WeakKeyDictionary[Any, dict[str, asyncio.Semaphore]] = (
            weakref.WeakKeyDictionary()
        )
        self._cost_warned: set[str] = set()
        # ``async (question) -> QuestionCheck | None``: set by ``open_worker_pool`` for a
        # sandbox with simulated workers, which only know the prepared tasks; None otherwise
        self.question_check: Any = None

        self._counter = attempt_counter()
        self.router = build_router(self._specs, provider_faults, router_kwargs)
        self._closed = False

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | list[Any],
        credentials: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> WorkerPool:
        """``WorkerPool(load_worker_specs(config, credentials), **kwargs)``."""
        return cls(load_worker_specs(config, credentials), **kwargs)

    # -- the pool as the Conductor sees it ----------------------------------------------------
    @property
    def specs(self) -> list[WorkerSpec]:
        return list(self._specs)

    @property
    def names(self) -> list[str]:
        return [spec.name for spec in self._specs]

    @property
    def descriptions(self) -> list[str]:
        """One description per worker, in index order (for the Conductor's prompt)."""
        return [spec.description for spec in self._specs]

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"WorkerPool({self.names!r})"

    def spec(self, worker: int | str) -> WorkerSpec:
        """The spec for a worker index or name; IndexError/KeyError when there is none."""
        if isinstance(worker, bool):
            raise TypeError("worker must be an index or a name")
        if isinstance(worker, int):
            if not 0 <= worker < len(self._specs):
                raise IndexError(f"worker index {worker} out of range 0..{len(self._specs) - 1}")
            return self._specs[worker]
        if worker not in self._by_name:
            raise KeyError(f"unknown worker {worker!r}")
        return self._by_name[worker]

    # -- calls --------------------------------------------------------------------------------
    async def __call__(
        self,
        worker: int | str,
        messages: list[dict[str, str]],
        sample_index: int = 0,
        **overrides: Any,
    ) -> WorkerReply:
        return await self.call(worker, messages, sample_index, **overrides)

    async def call(
        self,
        worker: int | str,
        messages: list[dict[str, str]],
        sample_index: int = 0,
        **overrides: Any,
    ) -> WorkerReply:
        """Ask one worker; a reply or a typed failure, never a provider exception."""
        if self._closed:
            raise RuntimeError("WorkerPool is closed")
        spec = self.spec(worker)
        reserved = sorted(set(overrides) & _RESERVED_OVERRIDES)
        if reserved:
            raise ValueError(f"cannot override {reserved[0]!r} per call")
        params = {**spec.sampling_params, **overrides}
        if sample_index and "seed" not in params:
            # repeated samples of one request must differ: providers that honour a seed (vLLM,
            # OpenAI, the sandbox) vary through it; litellm drops it for those that do not
            params["seed"] = sample_index
        started = time.perf_counter()

        key = None
        if self.cache is not None and self.cache.mode != "off":
            sampling = {k: v for k, v in params.items() if k not in _NOT_IN_KEY}
            key = cache_key(spec.name, spec.model, messages, sampling, sample_index)
            try:
                cached = await self.cache.aget(key)
            except Exception as exc:  # a broken cache must not stop the run
                log.warning("response cache lookup failed: %s", self._scrub(str(exc)))
                cached = None
            if cached is not None:
                reply = WorkerReply(
                    worker=spec.name,
                    text=cached.text,
                    usage=Usage(
                        prompt_tokens=cached.prompt_tokens,
                        completion_tokens=cached.completion_tokens,
                        cost_usd=0.0,
                        latency_s=time.perf_counter() - started,
                        cache_hit=True,
                    ),
                    attempts=0,
                    served_by=cached.served_by,
                )
                return self._record(reply, sample_index, "cache")
            if self.cache.mode == "read_only":
                reply = WorkerReply(
                    worker=spec.name,
                    text=None,
                    usage=Usage(latency_s=time.perf_counter() - started),
                    failure=FailureKind.PROVIDER_ERROR,
                    error=READ_ONLY_MISS,
                    attempts=0,
                )
                return self._record(reply, sample_index, "none")

        async with self._semaphore(spec):
            reply, cost_source = await self._call_router(spec, messages, params, started)

        if reply.ok and key is not None and self.cache is not None:
            try:
                await self.cache.aput(
                    key,
                    spec.name,
                    reply.text or "",
                    prompt_tokens=reply.usage.prompt_tokens,
                    completion_tokens=reply.usage.completion_tokens,
                    cost_usd=reply.usage.cost_usd,
                    served_by=reply.served_by,
                )
            except Exception as exc:
                log.warning("response cache write failed: %s", self._scrub(str(exc)))
        return self._record(reply, sample_index, cost_source)

    def _semaphore(self, spec: WorkerSpec) -> asyncio.Semaphore:
        # asyncio primitives belong to one event loop; keep one set per running loop.
        loop = asyncio.get_running_loop()
        per_loop = self._semaphores.get(loop)
        if per_loop is None:
            per_loop = self._semaphores[loop] = {}
        if spec.name not in per_loop:
            per_loop[spec.name] = asyncio.Semaphore(spec.max_concurrency)
        return per_loop[spec.name]

    async def _call_router(
        self,
        spec: WorkerSpec,
        messages: list[dict[str, str]],
        params: Mapping[str, Any],
        started: float,
    ) -> tuple[WorkerReply, str]:
        call_id = uuid.uuid4().hex
        self._counter.open(call_id)
        try:
            response = await self.router.acompletion(
                model=spec.name, messages=messages, metadata={CALL_ID: call_id}, **params
            )
        except asyncio.CancelledError:
            self._counter.close(call_id)
            raise
        except Exception as exc:
            failed = self._counter.close(call_id)
            kind = failure_kind(exc)
            reply = WorkerReply(
                worker=spec.name,
                text=None,
                usage=Usage(latency_s=time.perf_counter() - started),
                failure=kind,
                error=self._error_text(exc),
                attempts=max(failed, 1),
            )
            return reply, "none"
        failed = self._counter.close(call_id)
        latency = time.perf_counter() - started

        headers = router_headers(response)
        served = headers.get("x-litellm-model-group") or spec.name
        if not isinstance(served, str):
            served = spec.name
        # litellm reports the retries of the answering group and the number of fallback hops;
        # the failure count above also sees the retries of the groups that gave up.
        floor = attempts_floor(headers)
        served_spec = self._by_name.get(served, spec)
        text, failure, error = reply_content(response)
        prompt_tokens, completion_tokens = reply_tokens(served_spec, messages, response, text)
        cost, cost_source = reply_cost(
            served_spec, response, prompt_tokens, completion_tokens, self._cost_warned
        )
        reply = WorkerReply(
            worker=spec.name,
            text=text if failure is None else None,
            usage=Usage(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                cost_usd=cost,
                latency_s=latency,
            ),
            failure=failure,
            error=error,
            attempts=max(failed + 1, floor),
            served_by=served if served != spec.name else None,
        )
        return reply, cost_source

    # -- records ------------------------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _error_text(self, exc: BaseException) -> str:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        first = lines[0] if lines else ""
        return self._scrub(f"{type(exc).__name__}: {first}"[:500])

    def _record(self, reply: WorkerReply, sample_index: int, cost_source: str) -> WorkerReply:
        if reply.error:
            reply.error = self._scrub(reply.error)
        record = UsageRecord(
            worker=reply.worker,
            served_by=reply.served_by,
            prompt_tokens=reply.usage.prompt_tokens,
            completion_tokens=reply.usage.completion_tokens,
            cost_usd=reply.usage.cost_usd,
            latency_s=reply.usage.latency_s,
            cache_hit=reply.usage.cache_hit,
            failure=reply.failure.value if reply.failure else None,
            attempts=reply.attempts,
            timestamp=time.time(),
            sample_index=sample_index,
            cost_source=cost_source,
            error=reply.error,
        )
        self.usage_log.append(record)
        if self.usage_log_path is not None:
            line = self._scrub(json.dumps(asdict(record), sort_keys=True))
            with self.usage_log_path.open("a", encoding="utf-8") as handle:
                handle.write(line + "\n")
        return reply

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per requested worker, over the calls ``usage_log`` keeps: calls, outcomes, tokens,
        dollars, latency, attempts."""
        return usage_summary(self.names, self.usage_log)

    # -- lifecycle ----------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Unregister the pool's litellm hooks and close a cache the pool opened."""
        if self._closed:
            return
        self._closed = True
        if self._provider_faults is not None:
            self._provider_faults.release()
        with contextlib.suppress(Exception):  # unregister the router's global hooks; best effort
            self.router.retire()
        if self._owns_cache and self.cache is not None:
            self.cache.close()

    async def __aenter__(self) -> WorkerPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
