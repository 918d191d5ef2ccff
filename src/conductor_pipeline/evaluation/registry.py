"""System kinds: what a name in ``evaluation.systems`` means, in one registered class each.

A kind declares its YAML settings and how they are checked, the kinds it needs, where its
rows sort in reports, and how it runs. :mod:`~conductor_pipeline.evaluation.config`,
:func:`~conductor_pipeline.evaluation.runner.evaluate` and
:func:`~conductor_pipeline.evaluation.metrics.system_order` read :data:`KINDS` instead of
listing kinds; the built-in ones live in :mod:`conductor_pipeline.evaluation.kinds`.

When a kind runs (``phase``):

- ``conductor``: its systems run question-major together with the other Conductor kinds;
- ``workers``: in registry order, alongside the Conductor phase (``moa`` after ``solo``, so
  its first layer comes from the response cache; ``handcrafted`` after ``solo``, whose
  validation answers it picks workers from);
- ``sized``: in registry order once both are done (it reads the Conductor's results);
- ``derived``: last, from the stored results, without calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from conductor_pipeline.config_checks import check_keys
from conductor_pipeline.evaluation.kind_settings import (
    declares_fields,
    make_declared,
    read_declared,
)
from conductor_pipeline.evaluation.records import QuestionResult
from conductor_pipeline.evaluation.systems import PoolView, System
from conductor_pipeline.tasks import Task
from conductor_pipeline.workflow import OrchestrationConfig

PHASES = ("conductor", "workers", "sized", "derived")
UNRANKED = (99, 0)  # a system no kind claims sorts after every known one


# ---------------------------------------------------------------------------------------
# Checks that name the offending key (shared by the config and the kinds' settings)
# ---------------------------------------------------------------------------------------


def check_number(value: Any, key: str, low: float, high: float) -> float:
    """``value`` as a float in ``[low, high)``; a ``ValueError`` naming ``key`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value < high:
        raise ValueError(f"evaluation.{key}: must be in [{low:g}, {high:g}), got {value!r}")
    return float(value)


def check_names(value: Any, key: str) -> list[str] | None:
    """A non-empty list of worker names, or ``None`` (every worker)."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise ValueError(f"evaluation.{key}: must be a non-empty list of worker names or null")
    return [str(v) for v in value]


def check_worker(pool: PoolView, name: str, key: str) -> int:
    """The pool position of the worker ``name``; a ``ValueError`` naming ``evaluation.<key>``
    when the pool has no such worker."""
    if name not in pool.names:
        raise ValueError(f"evaluation.{key}: no worker named {name!r} in the pool {pool.names}")
    return pool.names.index(name)


def check_section(params: Mapping[str, Any], name: str, allowed: set[str]) -> dict[str, Any]:
    """The mapping under ``params[name]`` (empty when absent), with no key outside ``allowed``."""
    section = params.get(name) or {}
    if not isinstance(section, Mapping):
        raise ValueError(f"evaluation.{name}: must be a mapping")
    check_keys(f"evaluation.{name}", section, allowed)
    return dict(section)


# ---------------------------------------------------------------------------------------
# What a kind sees while it runs
# ---------------------------------------------------------------------------------------


@dataclass
class RunContext:
    """One evaluation in progress. ``policies`` maps a Conductor kind's ``policy`` key to its
    ``PolicyUnderTest``; ``shared(policy)`` is that model behind the batching and sample-
    sharing wrappers; ``runner`` stores and counts pairs; ``results`` and
    ``validation_results`` (split ``validation``) fill up by system name."""

    config: Any  # EvaluationConfig (config.py imports this module)
    pool: PoolView
    orchestration: OrchestrationConfig
    test_tasks: Sequence[Task]
    validation_tasks: Sequence[Task]
    pool_id: str
    policies: Mapping[str, Any]
    shared: Any
    runner: Any
    worker_limit: asyncio.Semaphore
    info: dict[str, Any] = field(default_factory=dict)
    results: dict[str, list[QuestionResult]] = field(default_factory=dict)
    validation_results: dict[str, list[QuestionResult]] = field(default_factory=dict)

    def settings(self, kind: str) -> Any:
        """The parsed settings of ``kind`` (its defaults when the YAML has none)."""
        return self.config.settings_of(kind)

    async def run(
        self, system: System, tasks: Sequence[Task] | None = None, split: str = "test"
    ) -> list[QuestionResult]:
        """Run ``system`` on the test questions (or ``tasks``), at most ``concurrency`` worker
        questions in flight, and keep its rows under its name."""
        rows = await self.runner.run_pairs(
            system, self.test_tasks if tasks is None else tasks, split, self.worker_limit
        )
        (self.results if split == "test" else self.validation_results)[system.name] = rows
        return rows


# ---------------------------------------------------------------------------------------
# The kind and its registry
# ---------------------------------------------------------------------------------------


class SystemKind:
    """One name ``evaluation.systems`` may list. Subclass, set the class attributes, and
    override ``systems`` (or ``run`` for a kind that does more than run its systems on the
    test questions); :func:`register` makes it known everywhere.

    Settings: annotated fields with defaults in the class body (``n: int = 3``) make the
    kind a dataclass of them, read from ``evaluation.<name, - as _>`` and type-checked
    (:mod:`~conductor_pipeline.evaluation.kind_settings`); ``validate`` adds checks of its
    own and ``ctx.settings(name)`` is the configured kind. Or, explicitly, ``section``/
    ``Settings``: the YAML key under ``evaluation`` and the frozen dataclass it is read into
    (the default ``parse`` accepts its fields as they are). The class attributes below are
    set unannotated. ``needs``/``needs_reason``: a kind this one cannot run without, and why.
    ``rank``: where its rows sort in tables (lower first). ``per_worker``: its systems are
    named ``<name>:<worker>``. ``writes_workflows``: a Conductor model (reported as one).
    ``label_note``: a few words reports add to its name (``handcrafted (told the domain)``).
    """

    name: ClassVar[str]
    rank: ClassVar[tuple[int, int]]
    phase: ClassVar[str] = "workers"
    section: ClassVar[str | None] = None
    Settings: ClassVar[type | None] = None
    needs: ClassVar[str | None] = None
    needs_reason: ClassVar[str] = ""
    per_worker: ClassVar[bool] = False
    writes_workflows: ClassVar[bool] = False
    label_note: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not declares_fields(cls):
            return
        make_declared(cls)
        taken = {f.name for f in fields(cls)} & set(SystemKind.__annotations__)
        if taken:
            raise TypeError(f"{cls.__name__}: set {sorted(taken)} unannotated, not as fields")
        cls.Settings = cls
        if "section" not in cls.__dict__:
            cls.section = cls.name.replace("-", "_")

    def parse(self, section: dict[str, Any]) -> Any:
        """The settings from the YAML section (unknown keys already refused): a kind that
        declares its settings as fields, configured (type-checked, then ``validate``)."""
        if self.Settings is None:
            return None
        if not isinstance(self, self.Settings):
            return self.Settings(**section)
        configured = type(self)(**read_declared(type(self), section, f"evaluation.{self.section}"))
        configured.validate()
        return configured

    def validate(self) -> None:
        """Checks of declared settings beyond their types (a ``ValueError`` naming
        ``evaluation.<section>.<field>``), on the configured kind."""

    def claims(self, system: str) -> bool:
        """Whether a result row's ``system`` name belongs to this kind."""
        if self.per_worker:
            return system.startswith(f"{self.name}:")
        return system == self.name

    def check(self, ctx: RunContext) -> None:
        """Refuse settings that do not fit the pool (a ``ValueError`` naming the key), before
        any system runs."""

    def fitted_workers(self, ctx: RunContext) -> list[str]:
        """The workers whose solo answers on the validation questions this kind reads
        (``ctx.validation_results``): the ``solo`` kind runs them for it."""
        return []

    def pairs(self, ctx: RunContext) -> int:
        """(system, question) pairs it will run, for the progress bar."""
        return 0 if self.phase == "derived" else len(ctx.test_tasks)

    def systems(self, ctx: RunContext) -> list[System]:
        raise NotImplementedError(f"{type(self).__name__}.systems")

    async def run(self, ctx: RunContext) -> None:
        for system in self.systems(ctx):
            await ctx.run(system)


KINDS: dict[str, SystemKind] = {}
K = TypeVar("K", bound=type[SystemKind])


def register(cls: K) -> K:
    """Class decorator: make a kind known (registration order is the default ``systems``
    order and the order Conductor kinds are reported in)."""
    kind = cls()
    if kind.phase not in PHASES:
        raise ValueError(f"{cls.__name__}: phase must be one of {PHASES}, got {kind.phase!r}")
    if kind.name in KINDS:
        raise ValueError(f"a system kind named {kind.name!r} is registered already")
    if kind.section is not None and kind.Settings is None:
        raise ValueError(f"{cls.__name__}: a settings section needs a Settings class")
    KINDS[kind.name] = kind
    return cls


def kind_of(system: str) -> SystemKind | None:
    """The kind a result row's ``system`` name belongs to (``None``: no registered kind)."""
    return next((k for k in KINDS.values() if k.claims(system)), None)


def rank_of(system: str) -> tuple[int, int]:
    kind = kind_of(system)
    return kind.rank if kind is not None else UNRANKED


def label_note(system: str) -> str | None:
    """What reports add to a system's name (its kind's ``label_note``), if anything."""
    kind = kind_of(system)
    return kind.label_note if kind is not None else None
