"""``serving.batching``: the API's settings for the engine's micro-batcher
(:class:`~conductor_pipeline.generation.batching.MicroBatchingPolicy`, whose docstring says
how requests gather into batches and what a request gets from one)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from conductor_pipeline.config_checks import check_int, check_keys
from conductor_pipeline.generation.batching import (
    BatchGenerationError,
    BatchStats,
    MicroBatchingPolicy,
)

__all__ = [
    "BatchGenerationError",
    "BatchStats",
    "BatchingSettings",
    "MicroBatchingPolicy",
    "batched_policy",
]


@dataclass(frozen=True)
class BatchingSettings:
    """``serving.batching``: ``enabled`` (wrap a local policy), ``max_batch`` (samples per
    batched call), ``max_wait_ms`` (how long the first sample waits for others)."""

    enabled: bool = True
    max_batch: int = 16
    max_wait_ms: float = 200.0

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(
                f"serving.batching.enabled: must be true or false, got {self.enabled!r}"
            )
        check_int(self.max_batch, "serving.batching.max_batch", minimum=1)
        wait = self.max_wait_ms
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= 10_000:
            raise ValueError(
                f"serving.batching.max_wait_ms: must be a number from 0 to 10000, got {wait!r}"
            )

    @classmethod
    def from_mapping(cls, params: Mapping[str, Any] | None) -> BatchingSettings:
        params = dict(params or {})
        check_keys("serving.batching", params, (f.name for f in fields(cls)))
        return cls(**params)


def batched_policy(policy: Any, settings: BatchingSettings) -> Any:
    """``policy`` behind a :class:`MicroBatchingPolicy` when batching is enabled and the
    policy can batch continuously; otherwise ``policy`` itself (an endpoint
    batches on its server; the scripted policy needs no model)."""
    if settings.enabled and callable(getattr(policy, "complete_continuously", None)):
        return MicroBatchingPolicy(policy, settings)
    return policy
