"""evaluation nodes: run the systems (resumably), summarise, plot, log traces.

The work happens in ``conductor_pipeline.evaluation``; these functions resolve the Conductor
under test, start the worker pool from ``worker_pool_config`` (provided by the project hook,
never as ``params:``) and turn results into the catalog's tables, plot and metrics.

The Conductor systems' policies (and the policy server an evaluation launches) come from
``conductor_pipeline.evaluation.conductors``; the questions and the pool's identity from
``conductor_pipeline.evaluation.inputs``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from pathlib import Path
from typing import Any

import pandas as pd

from conductor_pipeline.evaluation import (
    EvaluationConfig,
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
from conductor_pipeline.evaluation.conductors import conductors_under_test
from conductor_pipeline.evaluation.inputs import evaluation_questions, pool_fingerprint
from conductor_pipeline.paths import project_relative, project_root
from conductor_pipeline.tasks.frames import tasks_from_frame

logger = logging.getLogger(__name__)


def run_evaluation(
    test_tasks: pd.DataFrame,
    train_tasks: pd.DataFrame,
    validation_tasks: pd.DataFrame,
    worker_pool_config: dict[str, Any],
    worker_credentials: dict[str, Any],
    conductor_params: dict[str, Any],
    evaluation_params: dict[str, Any],
    serving_params: dict[str, Any] | None = None,
    conductor_model_version: dict[str, Any] | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Evaluate every configured system on the selected test questions; finished pairs in
    the result store are reused. Returns the per-question table and a run summary.

    ``conductor_model_version`` (training's output, in the default pipeline) names the
    version just registered: it is the Conductor evaluated, unless
    ``evaluation.conductor.adapter`` says otherwise. ``serving_params`` (``serving``) say
    how to launch the policy server when ``evaluation.policy_server`` is ``vllm``."""
    from conductor_pipeline.workers.runtime import open_worker_pool
    from conductor_pipeline.workflow.config import orchestration_config

    config = EvaluationConfig.from_params(evaluation_params)
    orchestration = orchestration_config(conductor_params)
    root = project_root()
    test = evaluation_questions(config, test_tasks, train_tasks, validation_tasks)
    validation = select_tasks(
        tasks_from_frame(validation_tasks), config.validation_per_domain, config.seed
    )
    under_test = conductors_under_test(
        conductor_params,
        config,
        serving_params,
        (conductor_model_version or {}).get("model_uri"),
    )
    conductor, base = under_test.conductor, under_test.base
    warm_start, champion = under_test.warm_start, under_test.champion
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
    with (
        under_test.serving(),
        open_worker_pool(worker_pool_config, worker_credentials, root=root) as pool,
    ):
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
                champion=champion,
                validation_tasks=validation,
                store=store,
                pool_id=pool_fingerprint(worker_pool_config, root),
            )
        )
        faults = getattr(pool, "faults", None)
        if faults is not None:
            run.info["injected_faults"] = {
                "level": "pool" if hasattr(pool, "injector") else "provider",
                "rates": {kind.value: rate for kind, rate in faults.rates.items()},
                "seed": faults.seed,
                **faults.stats,
            }
    # project-relative: the run info (and its report) must not name the folder of a moved project
    store_shown = project_relative(store_path, root)
    info = {**run.info, "conductor_variant": conductor.variant, "store": store_shown}
    if warm_start is not None:
        info["warm_start_variant"] = warm_start.variant
    if champion is not None:
        info["champion_variant"] = champion.variant
    if under_test.served_names:
        info["policy_server_models"] = under_test.served_names
    info["conductor_is_base_policy"] = base is not None and conductor.variant == base.variant
    logger.info(
        "evaluation: %d pairs run, %d reused from the store; worker calls retried: %s; "
        "%d pairs infra-failed (left out of accuracy, run again on resume)",
        info["pairs_run"],
        info["pairs_reused"],
        info["worker_call_retries"],
        info["infra_failed_pairs"],
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
