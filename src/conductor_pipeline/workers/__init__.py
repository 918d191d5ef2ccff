"""The worker pool: worker LLMs behind litellm, with prices, a response cache and fault handling.

No Kedro and no MLflow here: a notebook can build a ``WorkerPool`` from a workers config and
call it directly (``await pool.call(0, messages)``).
"""

from .cache import CachedReply, ResponseCache, cache_key
from .config import Secret, WorkerConfigError, WorkerSpec, load_worker_specs
from .faults import FaultInjector, ProviderFaults, parse_fault_rates
from .pool import READ_ONLY_MISS, WorkerPool
from .types import FailureKind, Usage, WorkerCaller, WorkerReply
from .usage import UsageRecord

__all__ = [
    "READ_ONLY_MISS",
    "CachedReply",
    "FailureKind",
    "FaultInjector",
    "ProviderFaults",
    "ResponseCache",
    "Secret",
    "Usage",
    "UsageRecord",
    "WorkerCaller",
    "WorkerConfigError",
    "WorkerPool",
    "WorkerReply",
    "WorkerSpec",
    "cache_key",
    "load_worker_specs",
    "parse_fault_rates",
]
