"""The retraining pipeline's growing sources together: settings (``retraining_sources``),
one collection per run from the stored watermarks, and the commit after the run succeeded.

:func:`collect_sources` reads every enabled source from its watermark (traffic: captured
requests with feedback, ``tasks.sources.traffic``; the drop folder and LiveCodeBench by
``contest_date``, ``tasks.sources.dropfolder``). Every new task whose question is, or is near,
one of an evaluation split (validation and test; ``tasks.contamination``, with
``retraining_sources.contamination.similarity_threshold``) is left out, whatever its source,
and so is a question a source earlier in the run already gave: the result can be appended to the training split without
touching the test split (the anchor the promotion gates compare on). Nothing is written:
:func:`commit_all` stores the watermarks once the run that used them has succeeded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from conductor_pipeline.config_checks import check_keys
from conductor_pipeline.tasks.contamination import (
    DEFAULT_SIMILARITY_THRESHOLD,
    EvaluationIndex,
    check_threshold,
    evaluation_index,
)
from conductor_pipeline.tasks.sources import benchmarks
from conductor_pipeline.tasks.sources.dropfolder import (
    Batch,
    WatermarkStore,
    commit,
    iso_date,
    livecodebench_window,
    read_drop_folder,
)
from conductor_pipeline.tasks.sources.traffic import asked_question, load_traffic
from conductor_pipeline.tasks.splits import normalise_question
from conductor_pipeline.tasks.types import Task


@dataclass(frozen=True)
class TrafficSourceSettings:
    """``retraining_sources.traffic``: the capture folder the Conductor API writes."""

    enabled: bool = False
    path: str = "data/01_raw/traffic"
    domain: str = "traffic"
    difficulty: str = "medium"


@dataclass(frozen=True)
class DropFolderSettings:
    """``retraining_sources.drop_folder``."""

    enabled: bool = False
    path: str = "data/01_raw/drop"
    pattern: str = "*.jsonl"
    date_field: str | None = None
    start_date: Any = None
    end_date: Any = None
    domain: str = "drop"
    difficulty: str = "medium"


@dataclass(frozen=True)
class LiveCodeBenchWindowSettings:
    """``retraining_sources.livecodebench``: ``data_files`` is a local copy in the hub
    schema; null reads the hub (which must be reachable, or in the cache offline)."""

    enabled: bool = False
    data_files: Any = None
    version: str = "release_v6"
    start_date: Any = None
    end_date: Any = None
    include_functional: bool = True
    private_tests: bool = True


@dataclass(frozen=True)
class WatermarkSettings:
    """``retraining_sources.watermarks``: ``mlflow`` (experiment tags) or ``file``."""

    store: str = "mlflow"
    experiment: str = "conductor-retraining"
    path: str = "data/retraining_watermarks.json"


@dataclass(frozen=True)
class ContaminationSettings:
    """``retraining_sources.contamination``: how near an evaluation question a new one may
    be (character 3-gram containment, numbers and operators equal; 1: only equal
    normalised questions are left out)."""

    similarity_threshold: float = DEFAULT_SIMILARITY_THRESHOLD


@dataclass(frozen=True)
class SourcesSettings:
    watermarks: WatermarkSettings = field(default_factory=WatermarkSettings)
    contamination: ContaminationSettings = field(default_factory=ContaminationSettings)
    traffic: TrafficSourceSettings = field(default_factory=TrafficSourceSettings)
    drop_folder: DropFolderSettings = field(default_factory=DropFolderSettings)
    livecodebench: LiveCodeBenchWindowSettings = field(default_factory=LiveCodeBenchWindowSettings)


_PREFIX = "retraining_sources"


def _section(cls: type, params: Any, name: str) -> Any:
    if params is None:
        return cls()
    if not isinstance(params, Mapping):
        raise ValueError(f"{_PREFIX}.{name}: must be a mapping")
    known = {f.name: f for f in fields(cls)}
    check_keys(f"{_PREFIX}.{name}", params, known)
    for key, value in params.items():
        default = known[key].default
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ValueError(f"{_PREFIX}.{name}.{key}: must be true or false, got {value!r}")
        if isinstance(default, str) and not (isinstance(value, str) and value.strip()):
            raise ValueError(f"{_PREFIX}.{name}.{key}: must be a non-empty string, got {value!r}")
        if key in ("start_date", "end_date") and value is not None and iso_date(value) is None:
            raise ValueError(f"{_PREFIX}.{name}.{key}: not an ISO date, got {value!r}")
    return cls(**params)


def sources_settings(params: Mapping[str, Any] | None) -> SourcesSettings:
    """The ``retraining_sources`` mapping, validated; every error names the key."""
    params = dict(params or {})
    check_keys(_PREFIX, params, (f.name for f in fields(SourcesSettings)))
    settings = SourcesSettings(
        watermarks=_section(WatermarkSettings, params.get("watermarks"), "watermarks"),
        contamination=_section(ContaminationSettings, params.get("contamination"), "contamination"),
        traffic=_section(TrafficSourceSettings, params.get("traffic"), "traffic"),
        drop_folder=_section(DropFolderSettings, params.get("drop_folder"), "drop_folder"),
        livecodebench=_section(
            LiveCodeBenchWindowSettings, params.get("livecodebench"), "livecodebench"
        ),
    )
    check_threshold(
        settings.contamination.similarity_threshold,
        f"{_PREFIX}.contamination.similarity_threshold",
    )
    if settings.watermarks.store not in ("mlflow", "file"):
        raise ValueError(
            f"{_PREFIX}.watermarks.store: must be 'mlflow' or 'file', "
            f"got {settings.watermarks.store!r}"
        )
    return settings


# ------------------------------------------------------------------------------ all sources


@dataclass
class Collected:
    """One run's take from every enabled source: a batch per source (traffic's training
    tasks among them) and traffic's evaluation slice."""

    batches: list[Batch] = field(default_factory=list)
    evaluation: list[dict[str, Any]] = field(default_factory=list)

    def tasks(self) -> list[Task]:
        return [task for batch in self.batches for task in batch.tasks]

    @property
    def unchanged(self) -> bool:
        """Nothing new anywhere: no task and no evaluation row."""
        return not self.evaluation and all(batch.unchanged for batch in self.batches)

    def report(self) -> dict[str, Any]:
        return {
            "unchanged": self.unchanged,
            "tasks": len(self.tasks()),
            "evaluation_rows": len(self.evaluation),
            "sources": [batch.report() for batch in self.batches],
        }


def _path(root: Path, value: str) -> Path:
    path = Path(value)
    return path if path.is_absolute() else root / path


def collect_sources(
    settings: SourcesSettings,
    store: WatermarkStore,
    *,
    root: str | Path,
    test_questions: EvaluationIndex | Mapping[str, Iterable[str]] | Iterable[str],
) -> Collected:
    """Read each enabled source from its stored watermark. Nothing is written: call
    :func:`commit_all` once the run that used the result has succeeded.

    ``test_questions``: the evaluation questions no new task may be (an index, questions by
    split, or the test split's questions)."""
    root = Path(root)
    held_out = evaluation_index(
        test_questions, threshold=settings.contamination.similarity_threshold
    )
    out = Collected()
    if settings.traffic.enabled:
        previous = store.read("traffic")
        found = load_traffic(
            _path(root, settings.traffic.path),
            held_out,
            since=previous,
            domain=settings.traffic.domain,
            difficulty=settings.traffic.difficulty,
        )
        out.batches.append(
            Batch(
                source="traffic",
                tasks=found.train,
                previous=previous,
                watermark=found.watermark or previous,
                summary=found.summary,
            )
        )
        out.evaluation.extend(found.evaluation)
    drop = settings.drop_folder
    if drop.enabled:
        out.batches.append(
            read_drop_folder(
                _path(root, drop.path),
                store.read("drop_folder"),
                pattern=drop.pattern,
                domain=drop.domain,
                difficulty=drop.difficulty,
                date_field=drop.date_field,
                start_date=drop.start_date,
                end_date=drop.end_date,
            )
        )
    lcb = settings.livecodebench
    if lcb.enabled:
        out.batches.append(
            livecodebench_window(
                _livecodebench_rows(lcb, root),
                store.read("livecodebench"),
                start_date=lcb.start_date,
                end_date=lcb.end_date,
                include_functional=lcb.include_functional,
                private_tests=lcb.private_tests,
            )
        )
    _leave_out_known_questions(out.batches, held_out)
    return out


def _leave_out_known_questions(batches: list[Batch], held_out: EvaluationIndex) -> None:
    """Drop tasks whose question is, or is near, an evaluation question, or came earlier in
    this run."""
    seen: set[str] = set()
    for batch in batches:
        kept: list[Task] = []
        batch.summary.setdefault("in_test_split", 0)
        batch.summary["repeated_in_run"] = 0
        for task in batch.tasks:
            key = normalise_question(task.question)
            if asked_question(task.question) in held_out or task.question in held_out:
                batch.summary["in_test_split"] += 1
            elif key in seen:
                batch.summary["repeated_in_run"] += 1
            else:
                seen.add(key)
                kept.append(task)
        batch.tasks = kept


def _livecodebench_rows(lcb: LiveCodeBenchWindowSettings, root: Path) -> list[dict[str, Any]]:
    if lcb.data_files is not None:
        files = [lcb.data_files] if isinstance(lcb.data_files, str) else list(lcb.data_files)
        return benchmarks.read_local_rows([_path(root, str(f)) for f in files])
    urls = [
        f"hf://datasets/livecodebench/code_generation_lite/{name}"
        for name in benchmarks.livecodebench_files(lcb.version)
    ]
    return benchmarks._hub_rows("livecodebench", "json", data_files={"test": urls}, split="test")


def commit_all(store: WatermarkStore, collected: Collected | Mapping[str, Any]) -> list[str]:
    """Store every batch's watermark that moved; returns the sources whose mark moved.

    ``collected`` may also be its :meth:`Collected.report` (plain JSON): a scheduler that
    runs the last node in another process (an Airflow task) commits from the stored report.
    """
    if isinstance(collected, Collected):
        batches = collected.batches
    else:
        batches = [
            Batch(
                source=str(entry["source"]),
                previous=entry["previous_watermark"],
                watermark=entry["watermark"],
            )
            for entry in collected.get("sources", [])
        ]
    return [batch.source for batch in batches if commit(store, batch)]


def join_training(train: Iterable[Task], new: Iterable[Task]) -> tuple[list[Task], list[str]]:
    """The training split with the new tasks after it, less those whose question (or id) it
    already holds; returns the joined list and the ids left out. The test split is not
    touched, so the fixed anchor stays what the champion was measured on."""
    joined = list(train)
    questions = {normalise_question(task.question) for task in joined}
    ids = {task.id for task in joined}
    left_out: list[str] = []
    for task in new:
        key = normalise_question(task.question)
        if key in questions or task.id in ids:
            left_out.append(task.id)
            continue
        questions.add(key)
        ids.add(task.id)
        joined.append(task)
    return joined, left_out
