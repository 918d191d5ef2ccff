"""What ``kedro run`` checks before Kedro opens a session, so that a run that cannot start
fails in a second with one message naming the fix, and leaves no MLflow run behind
(kedro-mlflow starts its run in ``before_pipeline_run``, after these checks):

* every ``--pipelines`` name is registered (with the closest registered name);
* the configuration environment exists;
* every ``--params`` key names a configured parameter (with the closest one);
* every ``params:`` input of the nodes that will run is configured;
* the parameter sections those nodes read pass the project's own validation
  (``EvaluationConfig.from_params``, ``TrainingConfig.from_params``, ...);
* every file the run reads but does not write exists (with the pipeline that writes it).

:func:`check_run` raises :class:`RunCheckFailed`; ``run_errors`` prints it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from difflib import get_close_matches
from pathlib import Path
from typing import Any

__all__ = ["PARAMETER_CHECKS", "RunCheckFailed", "check_run"]


class RunCheckFailed(Exception):
    """A ``kedro run`` that cannot start; the message says what is wrong and the fix."""


def _check_data_prep(params: Any) -> None:
    from conductor_pipeline.pipelines.data_prep.nodes import validate_params

    validate_params(params)


def _check_training(params: Any) -> None:
    from conductor_pipeline.training.configs import TrainingConfig

    TrainingConfig.from_params(params)


def _check_evaluation(params: Any) -> None:
    from conductor_pipeline.evaluation.config import EvaluationConfig

    EvaluationConfig.from_params(params)


def _check_promotion(params: Any) -> None:
    from conductor_pipeline.promotion import Gates

    Gates.from_params(dict((params or {}).get("gates") or {}))


def _check_preflight(params: Any) -> None:
    from conductor_pipeline.preflight import PreflightSettings

    PreflightSettings.from_params(params)


# parameter section -> the validation its nodes run first (raising ValueError naming the key)
PARAMETER_CHECKS: dict[str, Callable[[Any], None]] = {
    "data_prep": _check_data_prep,
    "training": _check_training,
    "evaluation": _check_evaluation,
    "promotion": _check_promotion,
    "preflight": _check_preflight,  # read by the project's hooks on every run
}
# sections checked whatever the pipeline (read by hooks, not by nodes)
_ALWAYS_CHECKED = ("preflight",)


def _closest(word: str, choices: Iterable[str]) -> str:
    match = get_close_matches(word, list(choices), n=1)
    return f"; did you mean '{match[0]}'?" if match else ""


def _dotted_keys(mapping: Mapping[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        keys.append(path)
        if isinstance(value, Mapping):
            keys.extend(_dotted_keys(value, f"{path}."))
    return keys


def _leaf_keys(mapping: Mapping[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            keys.extend(_leaf_keys(value, f"{path}."))
        else:
            keys.append(path)
    return keys


def _lookup(params: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    value: Any = params
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _pipeline_names(options: Mapping[str, Any]) -> list[str]:
    names = list(options.get("pipelines") or [])
    if options.get("pipeline"):
        names.append(options["pipeline"])
    return names or ["__default__"]


def check_pipelines(names: list[str]) -> Any:
    """The registered pipelines ``names`` combined; an unknown name raises."""
    from kedro.framework.project import pipelines
    from kedro.pipeline import Pipeline

    known = [name for name in pipelines if name != "__default__"]
    combined = Pipeline([])
    for name in names:
        if name not in pipelines:
            raise RunCheckFailed(
                f"no pipeline '{name}'{_closest(name, known)} (kedro registry list shows all)"
            )
        combined += pipelines[name]
    return combined


def _selected(combined: Any, options: Mapping[str, Any]) -> Any:
    """The nodes the run will execute (the ``--nodes``/``--tags``/... filters applied)."""
    try:
        return combined.filter(
            tags=options.get("tags") or None,
            from_nodes=options.get("from_nodes") or None,
            to_nodes=options.get("to_nodes") or None,
            node_names=options.get("node_names") or None,
            from_inputs=options.get("from_inputs") or None,
            to_outputs=options.get("to_outputs") or None,
            node_namespaces=options.get("namespaces") or None,
        )
    except ValueError as error:  # e.g. "Pipeline does not contain nodes named [...]"
        raise RunCheckFailed(
            f"{error} (kedro registry describe <pipeline> lists its nodes)"
        ) from error


def _config_loader(options: Mapping[str, Any], project: Path, runtime: Any) -> Any:
    """The configuration loader Kedro's session will build for these options."""
    from kedro.framework.project import settings

    conf_source = options.get("conf_source") or str(project / settings.CONF_SOURCE)
    env = options.get("env") or os.environ.get("KEDRO_ENV")
    if env and Path(conf_source).is_dir() and not (Path(conf_source) / env).is_dir():
        envs = sorted(p.name for p in Path(conf_source).iterdir() if p.is_dir())
        raise RunCheckFailed(
            f"no configuration environment '{env}' ({Path(conf_source) / env} does not "
            f"exist){_closest(env, envs)} (the folders of conf/: {', '.join(envs)})"
        )
    return settings.CONFIG_LOADER_CLASS(
        conf_source=conf_source, env=env, runtime_params=runtime, **settings.CONFIG_LOADER_ARGS
    )


def check_runtime_params(runtime: Mapping[str, Any], configured: Mapping[str, Any]) -> None:
    """Each ``--params`` key names a configured parameter. A section of
    :data:`PARAMETER_CHECKS` judges its own keys (its optional ones need not be configured);
    elsewhere a key that is not configured is refused when its section is not configured
    either, or when it is a near miss of a configured key (a typo, silently ignored else)."""
    known = _dotted_keys(configured)
    for key in _leaf_keys(runtime):
        section = key.split(".")[0]
        if _lookup(configured, key)[0] or section in PARAMETER_CHECKS and section in configured:
            continue
        suggestion = _closest(key, known)
        if section in configured and not suggestion:
            continue  # an optional setting the section's code reads with a default
        raise RunCheckFailed(
            f"unknown parameter '{key}' in --params{suggestion} "
            "(the parameters are in conf/base/parameters*.yml)"
        )


def check_parameters(pipeline: Any, params: Mapping[str, Any]) -> None:
    """Every ``params:`` input of ``pipeline`` is configured, and the sections it reads
    pass their validation."""
    sections = set(_ALWAYS_CHECKED)
    for node in pipeline.nodes:
        for name in node.inputs:
            if not name.startswith("params:"):
                continue
            key = name[len("params:") :]
            if not _lookup(params, key)[0]:
                raise RunCheckFailed(
                    f"missing parameter '{key}' (node '{node.name}' reads {name})"
                    f"{_closest(key, _dotted_keys(params))}; set it in conf/base/parameters*.yml"
                )
            sections.add(key.split(".")[0])
    for section in sorted(sections & set(PARAMETER_CHECKS)):
        try:
            PARAMETER_CHECKS[section](params.get(section))
        except (ValueError, TypeError) as error:
            message = str(error)
            if not message.startswith(section):
                message = f"{section}: {message}"
            raise RunCheckFailed(
                f"{message} (fix it in conf/*/parameters*.yml or in --params)"
            ) from error


def _producers(dataset: str) -> list[str]:
    from kedro.framework.project import pipelines

    return [
        name
        for name in pipelines
        if name != "__default__" and dataset in pipelines[name].all_outputs()
    ]


def check_input_files(pipeline: Any, catalog: Any) -> None:
    """Each local file the run reads but no node of it writes exists (``catalog``: a
    DataCatalog of the project's catalog configuration; datasets the hooks add are not in
    it and are not checked)."""
    names = sorted(n for n in pipeline.inputs() if not n.startswith("params:") and n in catalog)
    for name in names:
        dataset = catalog.get(name)
        filepath = getattr(dataset, "_filepath", None)
        if filepath is None or getattr(dataset, "_protocol", "file") != "file":
            continue  # only local files are checked; other datasets report when loaded
        if dataset.exists():
            continue
        writers = _producers(name)
        fix = (
            f"run `kedro run --pipelines {writers[0]}` first (it writes {name})"
            if writers
            else f"put the file there or point catalog entry '{name}' at it"
        )
        raise RunCheckFailed(f"input '{name}' is missing: {filepath} does not exist; {fix}")


def check_run(options: Mapping[str, Any], project: Path) -> None:
    """Everything :mod:`run_checks` checks, for the options of ``kedro run``; raises
    :class:`RunCheckFailed` on the first problem."""
    from kedro.config import MissingConfigException
    from kedro.framework.project import settings

    combined = check_pipelines(_pipeline_names(options))
    pipeline = _selected(combined, options)
    runtime = dict(options.get("params") or {})
    loader = _config_loader(options, project, runtime or None)
    params = loader["parameters"]
    if runtime:
        configured = _config_loader(options, project, None)["parameters"]
        check_runtime_params(runtime, configured)
    check_parameters(pipeline, params)
    try:
        catalog_config = loader["catalog"]
    except MissingConfigException:
        return
    try:
        credentials = loader["credentials"]
    except MissingConfigException:
        credentials = {}
    catalog = settings.DATA_CATALOG_CLASS.from_config(catalog_config, credentials)
    check_input_files(pipeline, catalog)
