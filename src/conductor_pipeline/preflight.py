"""The checks before a run spends anything (``preflight`` in ``conf/*/parameters_preflight.yml``):
every worker the run will call can be reached with its key, and every dataset it will load
loads, the evaluation benchmarks included, though evaluation comes days after training.
All problems are collected and reported together, one message per missing thing.

``kedro run`` runs them before its first node (``ProjectHooks.before_pipeline_run``) when
``preflight.enabled`` (on in conf/gpu, off in the sandbox), for what the run's pipelines
use; ``conductor preflight --env gpu`` runs them all alone. Which checks a pipeline needs
(:func:`checks_for`):

- ``workers``: a node takes ``worker_pool_config`` (training, evaluation);
- ``data_prep``: a node takes ``params:data_prep`` (its ``sources``);
- ``benchmarks``: a node takes ``params:evaluation`` or ``params:training`` (the benchmarks
  of ``evaluation.benchmarks``: a training run is checked for the evaluation that follows).

Datasets load through the loaders of ``conductor_pipeline.tasks.sources``, as the run
loads them (from the Hugging Face cache or ``data_files``); workers are probed by
:func:`conductor_pipeline.workers.probe.check_worker_pool`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from conductor_pipeline.config_checks import check_keys

__all__ = [
    "PreflightFailed",
    "PreflightSettings",
    "check_before_run",
    "check_datasets",
    "checks_for",
    "datasets_to_check",
    "run_preflight",
]

log = logging.getLogger(__name__)

CHECKS = ("workers", "data_prep", "benchmarks")


class PreflightFailed(RuntimeError):
    """Things a run needs are missing; ``problems`` holds one message for each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(f"{len(problems)} problem(s) found before the run")
        self.problems = list(problems)

    def __str__(self) -> str:
        lines = "\n".join(f"  - {problem}" for problem in self.problems)
        return (
            f"the preflight checks found {len(self.problems)} problem(s) before the first "
            f"step:\n{lines}\n(`conductor preflight --env <env>` runs these checks alone; "
            "`--params preflight.enabled=false` skips them)"
        )


@dataclass(frozen=True)
class PreflightSettings:
    """``preflight``: ``enabled`` (before ``kedro run``), which ``checks`` (``workers``,
    ``data_prep``, ``benchmarks``), ``hosted_completion`` (one short paid request per
    hosted worker instead of a look at its key only) and ``timeout_s`` per probe."""

    enabled: bool = False
    checks: tuple[str, ...] = CHECKS
    hosted_completion: bool = False
    timeout_s: float = 30.0

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None) -> PreflightSettings:
        params = dict(params or {})
        check_keys("preflight", params, cls.__dataclass_fields__)
        checks = tuple(params.pop("checks", CHECKS) or ())
        wrong = sorted(set(checks) - set(CHECKS))
        if wrong:
            raise ValueError(f"preflight.checks: unknown check(s) {wrong}; known: {list(CHECKS)}")
        settings = cls(checks=checks, **params)
        if not isinstance(settings.enabled, bool) or not isinstance(
            settings.hosted_completion, bool
        ):
            raise ValueError("preflight.enabled and preflight.hosted_completion: true or false")
        if not isinstance(settings.timeout_s, int | float) or settings.timeout_s <= 0:
            raise ValueError(f"preflight.timeout_s: a positive number, got {settings.timeout_s!r}")
        return settings


def checks_for(inputs: Collection[str]) -> set[str]:
    """The checks a pipeline whose nodes take ``inputs`` needs (see the module docstring)."""
    needed = set()
    if "worker_pool_config" in inputs:
        needed.add("workers")
    if "params:data_prep" in inputs:
        needed.add("data_prep")
    if "params:evaluation" in inputs or "params:training" in inputs:
        needed.add("benchmarks")
    return needed


@dataclass(frozen=True)
class DatasetToCheck:
    """One dataset the run loads: where it is configured, its source and options."""

    where: str
    source: str
    options: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0


def datasets_to_check(
    parameters: Mapping[str, Any], checks: Collection[str]
) -> list[DatasetToCheck]:
    """The ``data_prep.sources`` and ``evaluation.benchmarks`` of ``parameters`` that
    ``checks`` cover."""
    found: list[DatasetToCheck] = []
    if "data_prep" in checks:
        data_prep = parameters.get("data_prep") or {}
        seed = int(data_prep.get("seed", 0))
        for name, options in (data_prep.get("sources") or {}).items():
            found.append(DatasetToCheck(f"data_prep.sources.{name}", name, options or {}, seed))
    if "benchmarks" in checks:
        evaluation = parameters.get("evaluation") or {}
        seed = int(evaluation.get("seed", 0))
        for name, options in (evaluation.get("benchmarks") or {}).items():
            found.append(DatasetToCheck(f"evaluation.benchmarks.{name}", name, options or {}, seed))
    return found


def _first_lines(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_datasets(
    datasets: list[DatasetToCheck],
    load: Callable[..., list[Any]] | None = None,
) -> list[str]:
    """One message per dataset of ``datasets`` that does not load (``load``: the loader,
    ``tasks.sources.load_source`` by default) or loads empty. A dataset configured in
    several places (a benchmark both trained and evaluated on, with other seeds or limits)
    is loaded once, and its message names every place."""
    if load is None:
        from conductor_pipeline.tasks.sources import load_source as load
    same: dict[str, list[DatasetToCheck]] = {}
    for dataset in datasets:
        # the seed and limit only pick rows: the same data either loads or does not
        options = {k: v for k, v in dataset.options.items() if k != "limit"}
        key = json.dumps([dataset.source, options], sort_keys=True, default=str)
        same.setdefault(key, []).append(dataset)
    problems = []
    for group in same.values():
        dataset, where = group[0], " and ".join(d.where for d in group)
        try:
            tasks = load(dataset.source, seed=dataset.seed, **dict(dataset.options))
        except Exception as err:  # every failure is reported, whatever its kind
            problems.append(
                f"{where}: does not load ({type(err).__name__}: {_first_lines(str(err))}). "
                "Fix: download it into the Hugging Face cache (HF_DATASETS_OFFLINE=0 "
                "HF_HUB_OFFLINE=0; a gated dataset such as GPQA also needs its terms accepted "
                "on huggingface.co and `hf auth login`), or give it a local copy with "
                "data_files, or remove it from the profile's parameters"
            )
            continue
        if not tasks:
            problems.append(f"{where}: loads no questions. Fix: check its options")
        else:
            log.info("preflight: %s loads (%d questions)", where, len(tasks))
    return problems


def run_preflight(
    settings: PreflightSettings,
    checks: Collection[str],
    parameters: Mapping[str, Any],
    worker_pool: Mapping[str, Any] | None,
    credentials: Mapping[str, Any] | None,
    *,
    load: Callable[..., list[Any]] | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """Every problem the ``checks`` (limited to ``settings.checks``) find, ``[]`` when
    there is none."""
    from conductor_pipeline.workers.probe import check_worker_pool

    wanted = set(checks) & set(settings.checks)
    problems: list[str] = []
    if "workers" in wanted:
        if worker_pool is None:
            problems.append("worker_pool: the profile has no workers.yml with a worker_pool")
        else:
            problems += check_worker_pool(
                worker_pool,
                credentials,
                environ=environ,
                timeout_s=float(settings.timeout_s),
                hosted_completion=settings.hosted_completion,
            )
    problems += check_datasets(datasets_to_check(parameters, wanted), load)
    log.info("preflight: %s checked, %d problem(s)", sorted(wanted) or "nothing", len(problems))
    return problems


def check_before_run(inputs: Collection[str], read: Callable[[str], Any]) -> None:
    """``kedro run``'s preflight: raise :class:`PreflightFailed` when the checks the
    pipeline needs (its nodes take ``inputs``) find problems; nothing when
    ``preflight.enabled`` is off. ``read(name)`` gives a catalog entry (``params:...``,
    ``worker_pool_config``, ``worker_credentials``) or ``None`` when there is none.

    Several processes: each process checks for itself, as each will load and call the
    same things; no collective is needed, and every process stops on a problem."""
    settings = PreflightSettings.from_params(read("params:preflight"))
    checks = checks_for(inputs)
    if not settings.enabled or not checks:
        return
    parameters = {"data_prep": read("params:data_prep"), "evaluation": read("params:evaluation")}
    problems = run_preflight(
        settings,
        checks,
        parameters,
        read("worker_pool_config"),
        read("worker_credentials"),
    )
    if problems:
        raise PreflightFailed(problems)
