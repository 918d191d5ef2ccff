"""What the Conductor API serves (:class:`ConductorService`) and the endpoints ``GET /ready``
checks (:class:`Probe`): read by :func:`~conductor_pipeline.serving.app.create_app` and by
the endpoint functions of ``serving.handlers``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conductor_pipeline.serving.models import ServedModel
from conductor_pipeline.serving.settings import ServingSettings
from conductor_pipeline.workflow.orchestrator import OrchestrationConfig, OrchestrationResult

__all__ = ["ConductorService", "Probe"]


@dataclass(frozen=True)
class Probe:
    """An endpoint checked by ``GET /ready`` (its URL never leaves the server)."""

    name: str
    url: str
    api_key: str | None = None

    def __repr__(self) -> str:
        return f"Probe({self.name!r})"


@dataclass
class ConductorService:
    """Everything a request needs: the policy, the pool, how to orchestrate, what is served.

    ``call_worker`` is a ``WorkerPool`` or any worker caller; ``tracer(result, tags)``
    records a trace and returns its id (``serving.tracing``); ``api_key`` enables bearer
    auth. ``question_check`` (``async (question) -> QuestionCheck | None``) tells whether the
    sandbox knows a question; by default the pool's own (``open_worker_pool`` sets one on a
    sandbox with simulated workers). ``secrets`` are the values the log masks (credentials,
    keys); the capture and feedback stores mask them too. ``root``: the project the
    capture path is relative to (by default the one :func:`project_root` finds).
    """

    policy: Any
    call_worker: Any
    descriptions: list[str]
    worker_names: list[str]
    orchestration: OrchestrationConfig
    served: ServedModel = field(default_factory=ServedModel)
    settings: ServingSettings = field(default_factory=ServingSettings)
    api_key: str | None = None
    probes: list[Probe] = field(default_factory=list)
    tracer: Callable[[OrchestrationResult, dict[str, str]], str | None] | None = None
    question_check: Callable[[str], Awaitable[Any]] | None = None
    secrets: list[str] = field(default_factory=list, repr=False)
    root: Path | None = None

    def __post_init__(self) -> None:
        if self.question_check is None:
            self.question_check = getattr(self.call_worker, "question_check", None)

    def __repr__(self) -> str:  # never the key
        return f"ConductorService(policy={getattr(self.policy, 'name', self.policy)!r}, served={self.served.id!r})"
