"""evaluation nodes: run the systems (resumably), summarise, plot, log traces.

The work happens in ``conductor_pipeline.evaluation``; these functions resolve the Conductor
under test, start the worker pool from ``worker_pool_config`` (provided by the project hook,
never as ``params:``) and turn results into the catalog's tables, plot and metrics.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
from pathlib import Path
from typing import Any

import pandas as pd

from conductor_pipeline.evaluation import (
    EvaluationConfig,
    PolicyUnderTest,
    PoolView,
    ResultStore,
    evaluate,
    format_table,
    mlflow_metrics,
    orchestration_from_record,
    pareto_figure,
    results_frame,
    routing_table,
    select_tasks,
    summarise,
    summarise_by_domain,
)
from conductor_pipeline.evaluation.systems import fingerprint
from conductor_pipeline.paths import project_root
from conductor_pipeline.tasks import Task

logger = logging.getLogger(__name__)

# where training puts the run's SFT-only adapter inside the trained one
# (``training.grpo.WARM_START_DIR``, repeated here: importing the trainer costs seconds)
WARM_START_DIR = "warm_start"


def _tasks(frame: pd.DataFrame) -> list[Task]:
    return [Task.from_record(row) for row in frame.to_dict(orient="records")]


def _folder_digest(folder: str, *, skip: str | None = None) -> str:
    """What a folder's model answers depend on: its files' names and bytes. ``skip``: a
    sub-folder left out (the warm-start adapter inside a trained one, which the trained
    Conductor never loads, so a new warm start does not re-run the Conductor's questions)."""
    digest = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*")):
        if skip is not None and path.relative_to(folder).parts[0] == skip:
            continue
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def build_policies(
    conductor_params: dict[str, Any], config: EvaluationConfig, candidate: str | None = None
) -> tuple[PolicyUnderTest, PolicyUnderTest | None]:
    """The Conductor under test and the untrained base policy.

    The Conductor is ``evaluation.conductor.adapter`` when set (it must then resolve), else
    ``candidate`` (the version training just registered, in the default pipeline; it must
    resolve too), else ``conductor.policy.adapter`` (default ``models:/conductor@champion``,
    which may not exist yet). While nothing is registered, the base policy is evaluated
    under the name ``conductor`` and its label says so; it is then the same model object as
    ``base-policy``, so it is sampled once. ``conductor.policy.kind: scripted`` evaluates the
    fixed rule under the name ``conductor``, labelled as such.
    """
    from conductor_pipeline.serving.models import resolve_served_model
    from conductor_pipeline.workflow.config import build_policy

    policy_params = dict(conductor_params.get("policy") or {})
    explicit = config.conductor.adapter is not None or candidate is not None
    reference = config.conductor.adapter or candidate or policy_params.get("adapter")
    served = resolve_served_model(reference, explicit=explicit, root=project_root())
    kind = policy_params.get("kind", "local")
    base_params = {**policy_params, **config.base_policy}
    base_params.pop("adapter", None)
    base_id = "base:" + fingerprint({k: v for k, v in base_params.items() if k != "api_key_env"})
    base_label = f"untrained base policy ({base_params.get('model_dir') or base_params.get('model') or 'SmolLM2-135M-Instruct'})"

    if kind == "scripted":
        worker = policy_params.get("worker", 0)
        rule = PolicyUnderTest(
            build_policy(policy_params),
            f"scripted:{worker}",
            f"SCRIPTED RULE (every question to worker {worker}; not a trained Conductor)",
        )
        wants_base = bool(config.base_policy) and base_params.get("kind") != "scripted"
        base = (
            PolicyUnderTest(build_policy(base_params), base_id, base_label) if wants_base else None
        )
        return rule, base
    if served.adapter_dir is None and kind == "local":
        base = build_policy(base_params, adapter_dir=None)
        note = (
            f"no trained adapter: {reference or 'no adapter configured'} does not resolve, "
            "so the untrained base policy is evaluated as the conductor"
        )
        logger.warning("evaluation: %s", note)
        return (
            PolicyUnderTest(base, base_id, f"BASE POLICY ({note})"),
            PolicyUnderTest(base, base_id, base_label),
        )
    if served.version == "adapter":
        variant = f"adapter:{_folder_digest(served.adapter_dir, skip=WARM_START_DIR)}"
        label = f"adapter folder {served.adapter_dir}"
    else:
        variant = served.id if served.adapter_dir else f"endpoint:{policy_params.get('model')}"
        label = (
            f"{served.reference} (version {served.version})"
            if served.adapter_dir
            else f"endpoint {policy_params.get('model')}"
        )
    conductor = PolicyUnderTest(
        build_policy(policy_params, adapter_dir=served.adapter_dir),
        variant,
        label,
        adapter_dir=served.adapter_dir if kind == "local" else None,
    )
    if kind != "local" and not config.base_policy:
        logger.warning(
            "evaluation: base-policy skipped: an endpoint Conductor needs evaluation.base_policy "
            "(e.g. {model: hosted_vllm/conductor-base}) to reach the untrained model"
        )
        return conductor, None
    return conductor, PolicyUnderTest(
        build_policy(base_params, adapter_dir=None), base_id, base_label
    )


def warm_start_policy(
    conductor: PolicyUnderTest, conductor_params: dict[str, Any], config: EvaluationConfig
) -> PolicyUnderTest | None:
    """The same training run's SFT-only adapter, when the Conductor under test carries one.

    Training copies the warm-start adapter into ``warm_start/`` of the trained adapter folder
    (and so into the registry); evaluating it next to ``conductor`` shows what GRPO added on
    top of the warm start. Its variant is a digest of that folder, so a rerun reuses its
    stored results and a new adapter runs again. Nothing to evaluate (logged, not an error):
    ``warm-start`` not listed, a Conductor that is not a local adapter (the base policy, a
    scripted rule, an endpoint as in ``conf/gpu``), or an adapter trained without a warm
    start (e.g. retrained from a champion).
    """
    from conductor_pipeline.workflow.config import build_policy

    if not config.wants("warm-start"):
        return None
    if conductor.adapter_dir is None:
        logger.info(
            "evaluation: warm-start skipped: the Conductor under test is not a local adapter"
        )
        return None
    folder = Path(conductor.adapter_dir) / WARM_START_DIR
    if not (folder / "adapter_config.json").is_file():
        logger.info(
            "evaluation: warm-start skipped: %s holds no %s/ adapter (trained without a warm start)",
            conductor.adapter_dir,
            WARM_START_DIR,
        )
        return None
    policy_params = dict(conductor_params.get("policy") or {})
    return PolicyUnderTest(
        build_policy(policy_params, adapter_dir=str(folder)),
        f"warm-start:{_folder_digest(str(folder))}",
        f"warm-start (SFT-only) adapter of {conductor.label}",
        adapter_dir=str(folder),
    )


def pool_fingerprint(worker_pool_config: dict[str, Any], root: Path) -> str:
    """What the answers of a pool depend on: its configuration (not the cache or the usage
    log) and, for the sandbox, the content of the worker profiles."""
    relevant = {k: v for k, v in worker_pool_config.items() if k not in ("cache", "usage_log")}
    sandbox = dict(relevant.get("sandbox") or {})
    profiles = sandbox.pop("profiles", None)
    sandbox.pop("tasks", None)
    sandbox.pop("torch_threads", None)
    relevant["sandbox"] = sandbox
    if profiles:
        path = Path(profiles) if Path(profiles).is_absolute() else root / profiles
        relevant["profiles_sha"] = (
            hashlib.sha256(path.read_bytes()).hexdigest()[:12] if path.is_file() else str(profiles)
        )
    return fingerprint(relevant)


def evaluation_questions(
    config: EvaluationConfig,
    test_tasks: pd.DataFrame,
    train_tasks: pd.DataFrame,
    validation_tasks: pd.DataFrame,
) -> list[Task]:
    """The questions evaluated: the prepared test split, or (``evaluation.benchmarks``) the
    configured benchmarks, without any question the Conductor saw in training or
    validation; then ``test_per_domain`` per domain (or per source)."""
    from conductor_pipeline.tasks.sources import load_source
    from conductor_pipeline.tasks.splits import normalise_question

    if config.benchmarks:
        tasks = []
        for name, options in config.benchmarks.items():
            try:
                loaded = load_source(name, seed=config.seed, **options)
            except (TypeError, ValueError) as err:
                raise ValueError(f"evaluation.benchmarks.{name}: {err}") from err
            logger.info("evaluation: benchmark %s, %d questions", name, len(loaded))
            tasks.extend(loaded)
    else:
        tasks = _tasks(test_tasks)
    seen = {
        normalise_question(q)
        for frame in (train_tasks, validation_tasks)
        for q in frame["question"]
    }
    kept = [t for t in tasks if normalise_question(t.question) not in seen]
    if len(kept) < len(tasks):
        logger.warning(
            "evaluation: %d questions dropped because they are in the train or validation split",
            len(tasks) - len(kept),
        )
    return select_tasks(kept, config.test_per_domain, config.seed, by=config.report_by)


def run_evaluation(
    test_tasks: pd.DataFrame,
    train_tasks: pd.DataFrame,
    validation_tasks: pd.DataFrame,
    worker_pool_config: dict[str, Any],
    worker_credentials: dict[str, Any],
    conductor_params: dict[str, Any],
    evaluation_params: dict[str, Any],
    conductor_model_version: dict[str, Any] | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Evaluate every configured system on the selected test questions; finished pairs in
    the result store are reused. Returns the per-question table and a run summary.

    ``conductor_model_version`` (training's output, in the default pipeline) names the
    version just registered: it is the Conductor evaluated, unless
    ``evaluation.conductor.adapter`` says otherwise."""
    from conductor_pipeline.workers.runtime import open_worker_pool
    from conductor_pipeline.workflow.config import orchestration_config

    config = EvaluationConfig.from_params(evaluation_params)
    orchestration = orchestration_config(conductor_params)
    root = project_root()
    test = evaluation_questions(config, test_tasks, train_tasks, validation_tasks)
    validation = select_tasks(_tasks(validation_tasks), config.validation_per_domain, config.seed)
    candidate = (conductor_model_version or {}).get("model_uri")
    conductor, base = build_policies(conductor_params, config, candidate)
    warm_start = warm_start_policy(conductor, conductor_params, config)
    store_path = Path(config.store) if Path(config.store).is_absolute() else root / config.store
    store = ResultStore(store_path)
    logger.info(
        "evaluation: %d test questions (%d validation for the router), conductor = %s; "
        "%d stored results in %s",
        len(test),
        len(validation),
        conductor.label,
        len(store),
        store_path,
    )
    with open_worker_pool(worker_pool_config, worker_credentials, root=root) as pool:
        view = PoolView.from_pool(pool)
        run = asyncio.run(
            evaluate(
                test,
                view,
                config,
                orchestration=orchestration,
                conductor=conductor,
                base_policy=base,
                warm_start=warm_start,
                validation_tasks=validation,
                store=store,
                pool_id=pool_fingerprint(worker_pool_config, root),
            )
        )
    info = {**run.info, "conductor_variant": conductor.variant, "store": str(store_path)}
    if warm_start is not None:
        info["warm_start_variant"] = warm_start.variant
    info["conductor_is_base_policy"] = base is not None and conductor.variant == base.variant
    logger.info(
        "evaluation: %d pairs run, %d reused from the store",
        info["pairs_run"],
        info["pairs_reused"],
    )
    return results_frame(run.results), info


def summarise_evaluation(
    evaluation_results: pd.DataFrame, evaluation_params: dict[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame, Any, dict[str, dict[str, float]]]:
    """The summary and per-domain tables, the cost–accuracy plot and the MLflow metrics;
    prints the summary table."""
    config = EvaluationConfig.from_params(evaluation_params)
    options = {
        "samples": config.bootstrap_samples,
        "confidence": config.confidence,
        "seed": config.seed,
    }
    summary = summarise(evaluation_results, **options)
    by_domain = summarise_by_domain(evaluation_results, by=config.report_by, **options)
    figure = pareto_figure(summary)
    metrics = mlflow_metrics(summary)
    policy = summary.loc[summary["system"] == "conductor", "policy"] if "policy" in summary else []
    header = "Evaluation summary (test split"
    if len(policy):
        header += f"; conductor = {policy.iloc[0]}"
    print(f"\n{header})\n{format_table(summary)}\n", flush=True)
    return summary, by_domain, figure, metrics


def summarise_routing(
    evaluation_results: pd.DataFrame, evaluation_params: dict[str, Any]
) -> pd.DataFrame:
    """Per Conductor system and domain (or benchmark): answer-step worker shares, workflow
    shape shares and the multi-step share (``conductor_pipeline.evaluation.routing``)."""
    config = EvaluationConfig.from_params(evaluation_params)
    return routing_table(evaluation_results, by=config.report_by)


def log_conductor_traces(
    evaluation_results: pd.DataFrame, evaluation_params: dict[str, Any]
) -> dict[str, Any]:
    """MLflow traces (``conductor_pipeline.tracing``) of a seeded sample of the Conductor's
    questions, tagged with the system, question and correctness. Returns the trace ids."""
    from conductor_pipeline.tracing import log_orchestration_trace

    config = EvaluationConfig.from_params(evaluation_params)
    rows = evaluation_results[
        evaluation_results["system"].isin(["conductor", "conductor+recursion"])
    ].to_dict(orient="records")
    rows.sort(key=lambda r: (r["system"], r["question_id"]))
    sample = random.Random(config.seed).sample(rows, min(config.trace_sample, len(rows)))
    traces = []
    for row in sample:
        try:
            result = orchestration_from_record(json.loads(row["detail"]))
            trace_id = log_orchestration_trace(
                result,
                name=row["system"],
                tags={
                    "system": row["system"],
                    "question_id": row["question_id"],
                    "domain": row["domain"],
                    "correct": str(bool(row["correct"])).lower(),
                    "policy": str(row.get("policy") or ""),
                },
            )
        except Exception as err:  # a trace is a convenience; never fail the evaluation on it
            logger.warning("trace of %s/%s not logged: %s", row["system"], row["question_id"], err)
            continue
        traces.append(
            {"trace_id": trace_id, "system": row["system"], "question_id": row["question_id"]}
        )
    return {"traces": traces}
