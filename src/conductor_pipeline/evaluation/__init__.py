"""Evaluation: the Conductor against the paper's baselines on the same questions and pool.

No Kedro and no MLflow here (the pipeline's nodes log); from a notebook::

    import asyncio
    from conductor_pipeline.evaluation import (
        EvaluationConfig, PolicyUnderTest, PoolView, ResultStore, evaluate, results_frame,
        select_tasks, summarise,
    )
    with open_worker_pool(config.worker_pool, config.credentials, root=root) as pool:
        run = asyncio.run(evaluate(select_tasks(tasks, 6, seed=0), PoolView.from_pool(pool),
                                   EvaluationConfig(), conductor=PolicyUnderTest(policy, "v1", "my adapter"),
                                   orchestration=orchestration_config(params["conductor"])))
    summarise(results_frame(run.results))
    routing_table(results_frame(run.results))   # answer workers and workflow shapes per domain
"""

from conductor_pipeline.evaluation.config import CONDUCTOR_SYSTEMS, SYSTEM_KINDS, EvaluationConfig
from conductor_pipeline.evaluation.fixed_workflows import (
    FixedWorkflowSystem,
    HandcraftedSystem,
    RandomWorkflowSystem,
    handcrafted_workflow,
    random_workflow,
)
from conductor_pipeline.evaluation.metrics import (
    CONTRACT_COLUMNS,
    bootstrap_ci,
    format_table,
    mcnemar_exact,
    mlflow_metrics,
    pareto_front,
    summarise,
    summarise_by_domain,
)
from conductor_pipeline.evaluation.plots import pareto_figure
from conductor_pipeline.evaluation.policies import SharedSamples, batching_policy
from conductor_pipeline.evaluation.records import (
    QuestionResult,
    orchestration_from_record,
    results_frame,
)
from conductor_pipeline.evaluation.routing import ROUTING_COLUMNS, question_routing, routing_table
from conductor_pipeline.evaluation.runner import (
    EvaluationRun,
    PolicyUnderTest,
    derive_oracle,
    derive_router,
    evaluate,
    select_tasks,
)
from conductor_pipeline.evaluation.store import ResultStore
from conductor_pipeline.evaluation.systems import (
    BestOfNSystem,
    ConductorSystem,
    MoASystem,
    PoolView,
    SoloSystem,
    majority_vote,
)

__all__ = [
    "CONDUCTOR_SYSTEMS",
    "CONTRACT_COLUMNS",
    "SYSTEM_KINDS",
    "BestOfNSystem",
    "ConductorSystem",
    "EvaluationConfig",
    "EvaluationRun",
    "FixedWorkflowSystem",
    "HandcraftedSystem",
    "MoASystem",
    "PolicyUnderTest",
    "PoolView",
    "QuestionResult",
    "ROUTING_COLUMNS",
    "RandomWorkflowSystem",
    "ResultStore",
    "SharedSamples",
    "batching_policy",
    "SoloSystem",
    "bootstrap_ci",
    "derive_oracle",
    "derive_router",
    "evaluate",
    "format_table",
    "handcrafted_workflow",
    "majority_vote",
    "mcnemar_exact",
    "mlflow_metrics",
    "orchestration_from_record",
    "pareto_figure",
    "pareto_front",
    "random_workflow",
    "question_routing",
    "results_frame",
    "routing_table",
    "select_tasks",
    "summarise",
    "summarise_by_domain",
]
