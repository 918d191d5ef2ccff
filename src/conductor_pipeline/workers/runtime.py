"""From configuration to a live pool: ``open_worker_pool`` starts the sandbox server when the
configured pool is the sandbox, builds the litellm pool with its cache, and cleans up after.

The ``worker_pool`` configuration (``conf/*/workers.yml``)::

    worker_pool:
      kind: sandbox                 # sandbox: local server of sim-* workers + SmolLM2
                                    # configured: the entries under `workers`
      cache: {path: data/03_primary/response_cache.sqlite, mode: read_write}
      usage_log: null               # a JSONL path to append every call's usage to
      sandbox:
        profiles: conf/base/sandbox_workers.yml
        workers: null               # a subset of profile names, in pool order (null: all)
        seed: 0
        latency_scale: 0.02         # fraction of the profiles' simulated latency slept
        load_real_model: true
        tasks: [data/05_model_input/train_tasks.parquet, ...]
      workers: []                   # kind: configured (see conductor_pipeline.workers.config)
      faults:                       # injected worker faults, for chaos runs (all rates 0: off)
        level: provider             # provider: below the litellm Router, one draw per attempt
                                    # pool: above it, one draw per pool call (no call made)
        seed: null                  # null: drawn per run (logged); an integer replays a run
        rates: {timeout: 0.0, rate_limit: 0.0, provider_error: 0.0, empty_reply: 0.0}

Relative paths are resolved against the project root.

``faults`` default to the provider level because that is where a real provider fails: the
Router's configured retries (``num_retries`` per worker) and fallbacks then run as they
would against a flaky API, and callers see only what is left after them. ``pool`` skips
the Router (no call is made for an injected fault), so every injected fault reaches the
caller; it also offers ``malformed_reply``, which only a reply can carry below the Router.

A fixed ``seed`` replays the same faults call for call, in this run and in the next, so a
pair that ran out of retries would fail the same way again on resume. ``seed: null``
draws a seed per run (logged, and in the pool's ``faults``), so a resume meets new faults,
as it would meet a provider that has recovered.

A sandbox pool that holds simulated ``sim-*`` workers gets a ``question_check`` (a
:class:`~conductor_pipeline.workers.sandbox.SandboxQuestionCheck`): those workers only know
the prepared tasks, so callers ask it whether a question is one and warn when it is not.
Any other pool's ``question_check`` stays None.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor_pipeline.config_checks import check_int, check_keys
from conductor_pipeline.workers.cache import ResponseCache
from conductor_pipeline.workers.faults import FaultInjector, ProviderFaults, parse_fault_rates
from conductor_pipeline.workers.pool import WorkerPool

logger = logging.getLogger(__name__)

_POOL_KEYS = {"kind", "cache", "usage_log", "sandbox", "workers", "defaults", "faults"}
_FAULT_KEYS = {"level", "seed", "rates"}
FAULT_LEVELS = ("provider", "pool")
_SANDBOX_KEYS = {
    "profiles",
    "workers",
    "seed",
    "latency_scale",
    "load_real_model",
    "tasks",
    "torch_threads",
    "real_model_concurrency",
}
_CACHE_MODES = ("read_write", "read_only", "off")


def _check(config: Mapping[str, Any]) -> None:
    check_keys("worker_pool", config, _POOL_KEYS)
    kind = config.get("kind")
    if kind not in ("sandbox", "configured"):
        raise ValueError(f"worker_pool.kind: must be 'sandbox' or 'configured', got {kind!r}")
    cache = config.get("cache") or {}
    if cache.get("mode", "read_write") not in _CACHE_MODES:
        raise ValueError(
            f"worker_pool.cache.mode: must be one of {_CACHE_MODES}, got {cache.get('mode')!r}"
        )
    if kind == "sandbox":
        check_keys("worker_pool.sandbox", config.get("sandbox") or {}, _SANDBOX_KEYS)
    elif not config.get("workers"):
        raise ValueError("worker_pool.workers: a configured pool needs at least one worker entry")
    fault_settings(config)


@dataclass(frozen=True)
class FaultSettings:
    """``worker_pool.faults`` once checked: the non-zero ``rates`` by failure kind name."""

    level: str = "provider"
    seed: int | None = None  # None: drawn when the pool opens
    rates: dict[str, float] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return bool(self.rates)


def fault_settings(config: Mapping[str, Any]) -> FaultSettings:
    """The ``faults`` section of a ``worker_pool`` configuration (absent or null: off).

    Raises ``ValueError`` naming the key for an unknown key, level or failure kind, a rate
    outside [0, 1], rates adding up to more than 1, or a seed that is not an integer or null.
    """
    section = config.get("faults")
    if section is None:
        return FaultSettings()
    if not isinstance(section, Mapping):
        raise ValueError("worker_pool.faults: must be a mapping (level, seed, rates)")
    check_keys("worker_pool.faults", section, _FAULT_KEYS)
    level = section.get("level") or "provider"
    if level not in FAULT_LEVELS:
        raise ValueError(f"worker_pool.faults.level: must be one of {FAULT_LEVELS}, got {level!r}")
    seed = check_int(section.get("seed"), "worker_pool.faults.seed", minimum=None, allow_none=True)
    rates = section.get("rates") or {}
    if not isinstance(rates, Mapping):
        raise ValueError("worker_pool.faults.rates: must map failure kinds to rates")
    try:
        parsed = parse_fault_rates(rates)
    except ValueError as err:
        raise ValueError(f"worker_pool.faults.rates: {err}") from None
    active = {kind: rate for kind, rate in parsed.items() if rate > 0}
    if level == "provider":
        unsupported = sorted(k.value for k in active if k not in ProviderFaults.SUPPORTED)
        if unsupported:
            raise ValueError(
                f"worker_pool.faults.rates: {unsupported} cannot be injected at level "
                "'provider' (below the router); use level: pool"
            )
    return FaultSettings(level, seed, {kind.value: rate for kind, rate in active.items()})


def _resolve(root: Path, path: str | Path) -> Path:
    path = Path(path)
    return path if path.is_absolute() else root / path


def _select(entries: list[dict[str, Any]], names: Sequence[str] | None) -> list[dict[str, Any]]:
    if not names:
        return entries
    by_name = {entry["name"]: entry for entry in entries}
    missing = [name for name in names if name not in by_name]
    if missing:
        raise ValueError(
            f"worker_pool.sandbox.workers: no sandbox profile named {missing}; known: {sorted(by_name)}"
        )
    return [by_name[name] for name in names]


@contextlib.contextmanager
def open_worker_pool(
    config: Mapping[str, Any],
    credentials: Mapping[str, Any] | None = None,
    *,
    root: Path,
    cache_mode: str | None = None,
    fault_rates: Mapping[str, float] | None = None,
    provider_fault_rates: Mapping[str, float] | None = None,
    fault_seed: int = 0,
) -> Iterator[WorkerPool]:
    """Yield a ready ``WorkerPool`` for ``config``; stop what was started on exit.

    ``cache_mode`` overrides the configured cache mode (e.g. ``"off"`` for a benchmark).
    ``fault_rates`` wraps every call in a :class:`FaultInjector` (above the router, no call is
    made for an injected fault); ``provider_fault_rates`` injects faults below the router, so
    retries and fallbacks really happen. Without either, the configured ``faults`` apply
    (see the module docstring); given either, the configured ones are ignored. The yielded
    pool's ``faults`` is the injector in use (its ``stats`` count what it did), or None.
    """
    _check(config)
    if fault_rates is None and provider_fault_rates is None:
        settings = fault_settings(config)
        if settings.active:
            if settings.level == "provider":
                provider_fault_rates = settings.rates
            else:
                fault_rates = settings.rates
            fault_seed = settings.seed
            if fault_seed is None:
                fault_seed = random.SystemRandom().randrange(2**31)
            logger.warning(
                "worker_pool.faults: injecting worker faults at level %r (seed %d): %s",
                settings.level,
                fault_seed,
                settings.rates,
            )
    cache_config = dict(config.get("cache") or {})
    mode = cache_mode or cache_config.get("mode", "read_write")
    cache = None
    if mode != "off" and cache_config.get("path"):
        cache_path = _resolve(root, cache_config["path"])
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache = ResponseCache(cache_path, mode=mode)
    usage_log = _resolve(root, config["usage_log"]) if config.get("usage_log") else None
    provider_faults = (
        ProviderFaults(provider_fault_rates, seed=fault_seed) if provider_fault_rates else None
    )

    with contextlib.ExitStack() as stack:
        if cache is not None:
            stack.callback(cache.close)
        question_check = None
        if config["kind"] == "sandbox":
            # the pool is handed out while the sandbox's real model may still be loading: a
            # call to it waits for the load on the server, and everything else goes on
            entries, question_check = _sandbox_entries(config.get("sandbox") or {}, root, stack)
            pool_config: Any = {"workers": entries, "defaults": config.get("defaults") or {}}
        else:
            pool_config = {
                "workers": list(config["workers"]),
                "defaults": config.get("defaults") or {},
            }
        pool = WorkerPool.from_config(
            pool_config,
            credentials,
            cache=cache,
            usage_log_path=usage_log,
            provider_faults=provider_faults,
        )
        pool.question_check = question_check
        pool.faults = provider_faults
        stack.callback(lambda: asyncio.run(pool.aclose()))
        if fault_rates:
            yield _FaultyPool(pool, FaultInjector(pool, dict(fault_rates), seed=fault_seed))
        else:
            yield pool


def _sandbox_entries(
    sandbox: Mapping[str, Any], root: Path, stack: contextlib.ExitStack
) -> tuple[list[dict[str, Any]], Any]:
    """Starts the sandbox server (answering, its real model possibly still loading) until
    ``stack`` closes; its worker entries, and its question check when the selected workers
    include simulated ones (None when only real models answer)."""
    from conductor_pipeline.workers.sandbox import (
        SandboxQuestionCheck,
        SandboxServer,
        load_profiles,
    )

    tasks = [_resolve(root, path) for path in sandbox.get("tasks") or []]
    missing = [str(path) for path in tasks if not path.is_file()]
    if missing:
        raise FileNotFoundError(
            f"worker_pool.sandbox.tasks: {missing} not found. The sandbox's simulated workers "
            "recognise the prepared tasks; run `make run` (or `kedro run --pipelines data_prep`) first."
        )
    server = SandboxServer(
        tasks_paths=tasks,
        profiles_path=_resolve(root, sandbox["profiles"]) if sandbox.get("profiles") else None,
        seed=int(sandbox.get("seed", 0)),
        latency_scale=float(sandbox.get("latency_scale", 1.0)),
        load_real_model=bool(sandbox.get("load_real_model", True)),
        torch_threads=sandbox.get("torch_threads", 1),
        real_model_concurrency=check_int(
            sandbox.get("real_model_concurrency", 1),
            "worker_pool.sandbox.real_model_concurrency",
            minimum=1,
        ),
    )
    server.start(wait_for_model=False)
    stack.callback(server.stop)
    entries = _select(server.pool_config(), sandbox.get("workers"))
    profiles = load_profiles(server.profiles_path)
    selected = {entry["name"] for entry in entries}
    if selected & {profile.name for profile in profiles.real}:
        # only a pool that calls the real worker is told its load failed
        server.watch_model_load(_warn_real_model_failed)
    if selected & {profile.name for profile in profiles.simulated}:
        return entries, SandboxQuestionCheck(server.url)
    return entries, None


def _warn_real_model_failed(error: str) -> None:
    # the run goes on with the simulated workers, so say once, when it happens, why every
    # call to the real worker will now fail (each such call is an infra failure)
    logger.warning(
        "worker_pool.sandbox: the real worker's model failed to load (%s); every call to it "
        "fails from now on and counts as an infra failure, while the simulated workers answer",
        error,
    )


class _FaultyPool:
    """A pool whose calls pass through a fault injector; everything else is the pool's."""

    def __init__(self, pool: WorkerPool, injector: FaultInjector):
        self._pool, self.injector = pool, injector
        self.faults = injector

    async def __call__(self, worker, messages, sample_index: int = 0, **overrides):
        return await self.injector(worker, messages, sample_index, **overrides)

    call = __call__

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def __len__(self) -> int:
        return len(self._pool)
