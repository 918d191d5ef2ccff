"""evaluation nodes: run the systems (resumably), summarise, plot, log traces.

The work happens in ``conductor_pipeline.evaluation``; these functions resolve the Conductor
under test, start the worker pool from ``worker_pool_config`` (provided by the project hook,
never as ``params:``) and turn results into the catalog's tables, plot and metrics.

An ``endpoint`` Conductor (``conf/gpu``) does not load adapters itself: the server decides
what it answers with. So with ``evaluation.policy_server: vllm`` the node launches the
policy server (``serving.vllm``) for the duration of the evaluation with every adapter it
evaluates as a named LoRA module (the candidate as ``conductor-v<N>``, the champion as
``conductor-v<M>``, a warm start next to them) and asks for each model by its served name;
the untrained base is asked for by the name the server gives the base model. Without it,
the endpoint is evaluated as whatever it serves and labelled as that endpoint, never as a
registry version (so promotion has nothing to decide on).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from dataclasses import dataclass
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
from conductor_pipeline.hashing import content_hash, files_hash
from conductor_pipeline.paths import project_relative, project_root
from conductor_pipeline.promotion import CHAMPION
from conductor_pipeline.registry import registered_model
from conductor_pipeline.tasks import Task
from conductor_pipeline.tasks.frames import tasks_from_frame

logger = logging.getLogger(__name__)

# where training puts the run's SFT-only adapter inside the trained one
# (``training.grpo.WARM_START_DIR``, repeated here: importing the trainer costs seconds)
WARM_START_DIR = "warm_start"


def _folder_digest(folder: str, *, skip: str | None = None) -> str:
    """What a folder's model answers depend on: its files' names and bytes. ``skip``: a
    sub-folder left out (the warm-start adapter inside a trained one, which the trained
    Conductor never loads, so a new warm start does not re-run the Conductor's questions)."""
    return files_hash(
        path
        for path in sorted(Path(folder).rglob("*"))
        if path.is_file() and (skip is None or path.relative_to(folder).parts[0] != skip)
    )


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
    if kind == "endpoint":
        # the server answers with whatever it was started with; naming the rows after the
        # registry version would let promotion compare a model with itself
        variant = f"endpoint:{policy_params.get('model')}"
        label = f"endpoint {policy_params.get('model')} at {policy_params.get('api_base')}"
        if served.adapter_dir:
            logger.warning(
                "evaluation: %s is not loaded by an endpoint Conductor; the rows are labelled "
                "%s (set evaluation.policy_server: vllm to evaluate the version itself)",
                served.reference or served.adapter_dir,
                label,
            )
    elif served.version == "adapter":
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
        build_policy(policy_params, adapter_dir=served.adapter_dir if kind == "local" else None),
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


def _champion() -> Any:
    """The registry's champion as a ``ServedModel`` (version ``base`` while there is none)."""
    from conductor_pipeline.serving.models import resolve_served_model

    return resolve_served_model(
        f"models:/{registered_model()}@{CHAMPION}", explicit=False, root=project_root()
    )


def champion_policy(
    conductor: PolicyUnderTest, conductor_params: dict[str, Any], config: EvaluationConfig
) -> PolicyUnderTest | None:
    """The current champion, evaluated next to a different Conductor under test, so that
    promotion gates the candidate against figures measured now, on the same questions, by
    the same means. ``None`` (logged) when ``champion`` is not listed, nothing is champion
    yet, the Conductor under test is the champion, or the policy cannot load its adapter in
    this process (an endpoint without ``evaluation.policy_server: vllm``; a scripted rule).
    """
    from conductor_pipeline.workflow.config import build_policy

    if not config.wants("champion"):
        return None
    policy_params = dict(conductor_params.get("policy") or {})
    kind = policy_params.get("kind", "local")
    if kind != "local":
        logger.info(
            "evaluation: champion skipped: a %s Conductor cannot switch to the champion's "
            "adapter (evaluation.policy_server: vllm serves both)",
            kind,
        )
        return None
    champion = _champion()
    if champion.adapter_dir is None:
        logger.info("evaluation: champion skipped: no %s@%s yet", registered_model(), CHAMPION)
        return None
    if champion.id == conductor.variant:
        logger.info("evaluation: champion skipped: %s is the Conductor under test", champion.id)
        return None
    return PolicyUnderTest(
        build_policy(policy_params, adapter_dir=champion.adapter_dir),
        champion.id,
        f"champion {champion.reference} (version {champion.version})",
        adapter_dir=champion.adapter_dir,
    )


@dataclass
class ServedConductors:
    """What an evaluation with ``policy_server: vllm`` asks for, and the (not yet started)
    server that serves all of it: every adapter as a named LoRA module on one base model."""

    server: Any  # VllmPolicyServer
    conductor: PolicyUnderTest
    base: PolicyUnderTest | None
    champion: PolicyUnderTest | None
    warm_start: PolicyUnderTest | None

    @property
    def served_names(self) -> dict[str, str]:
        """System → the model name it asks the server for (for the run info and tests)."""
        named = {
            "conductor": self.conductor,
            "champion": self.champion,
            "warm-start": self.warm_start,
            "base-policy": self.base,
        }
        return {
            system: put.policy.model.split("/", 1)[1]
            for system, put in named.items()
            if put is not None
        }


def served_conductors(
    conductor_params: dict[str, Any],
    config: EvaluationConfig,
    serving_params: dict[str, Any] | None,
    candidate: str | None = None,
) -> ServedConductors:
    """Plan the policy server for an evaluation: the Conductor under test (resolved as in
    :func:`build_policies`), the champion (unless it is the one under test) and the warm
    start each become a LoRA module named after its version (``conductor-v3``), and the
    base-policy asks for the base model by its served name. The variants are those of the
    in-process evaluation (``conductor/3``), so promotion decides on the version measured."""
    from conductor_pipeline.serving.models import resolve_served_model
    from conductor_pipeline.serving.policy_server import (
        VllmPolicyServer,
        VllmSettings,
        versioned_lora_name,
    )

    policy_params = dict(conductor_params.get("policy") or {})
    if policy_params.get("kind", "local") == "scripted":
        raise ValueError(
            "evaluation.policy_server: vllm serves model adapters; a scripted Conductor "
            "(conductor.policy.kind: scripted) has none"
        )
    settings = VllmSettings.from_mapping(dict((serving_params or {}).get("vllm") or {}))
    explicit = config.conductor.adapter is not None or candidate is not None
    reference = config.conductor.adapter or candidate or policy_params.get("adapter")
    served = resolve_served_model(reference, explicit=explicit, root=project_root())

    modules: dict[str, str] = {}
    names: dict[str, str] = {}  # system -> served name of its adapter
    labels: dict[str, tuple[str, str, str]] = {}  # system -> (variant, label, adapter_dir)
    if served.adapter_dir is not None:
        if served.version == "adapter":
            digest = _folder_digest(served.adapter_dir, skip=WARM_START_DIR)
            variant, label = f"adapter:{digest}", f"adapter folder {served.adapter_dir}"
            names["conductor"] = versioned_lora_name(settings.lora_name, f"adapter-{digest}")
        else:
            variant = served.id
            label = f"{served.reference} (version {served.version})"
            names["conductor"] = versioned_lora_name(settings.lora_name, f"v{served.version}")
        modules[names["conductor"]] = served.adapter_dir
        labels["conductor"] = (variant, label, served.adapter_dir)
        folder = Path(served.adapter_dir) / WARM_START_DIR
        if config.wants("warm-start") and (folder / "adapter_config.json").is_file():
            names["warm-start"] = f"{names['conductor']}-warm-start"
            modules[names["warm-start"]] = str(folder)
            labels["warm-start"] = (
                f"warm-start:{_folder_digest(str(folder))}",
                f"warm-start (SFT-only) adapter of {label}",
                str(folder),
            )
    if config.wants("champion"):
        champion = _champion()
        under_test = labels.get("conductor", ("",))[0]
        if champion.adapter_dir is not None and champion.id != under_test:
            names["champion"] = versioned_lora_name(settings.lora_name, f"v{champion.version}")
            modules[names["champion"]] = champion.adapter_dir
            labels["champion"] = (
                champion.id,
                f"champion {champion.reference} (version {champion.version})",
                champion.adapter_dir,
            )
        else:
            logger.info("evaluation: champion skipped: none registered, or it is under test")

    server = VllmPolicyServer(settings, None, lora_modules=modules)
    base_id = "base:" + fingerprint({"policy_server": "vllm", "base_model": settings.base_model})
    base = PolicyUnderTest(
        server.endpoint(server.base_name),
        base_id,
        f"untrained base policy ({settings.base_model}, served as {server.base_name})",
    )

    def put(system: str) -> PolicyUnderTest | None:
        if system not in names:
            return None
        variant, label, folder = labels[system]
        return PolicyUnderTest(server.endpoint(names[system]), variant, label, adapter_dir=folder)

    conductor = put("conductor")
    if conductor is None:
        note = (
            f"no trained adapter: {reference or 'no adapter configured'} does not resolve, "
            "so the untrained base policy is evaluated as the conductor"
        )
        logger.warning("evaluation: %s", note)
        conductor = PolicyUnderTest(base.policy, base_id, f"BASE POLICY ({note})")
    return ServedConductors(
        server=server,
        conductor=conductor,
        base=base if config.wants("base-policy") else None,
        champion=put("champion"),
        warm_start=put("warm-start"),
    )


def pool_fingerprint(worker_pool_config: dict[str, Any], root: Path) -> str:
    """What the answers of a pool depend on: its configuration (not the cache, the usage
    log or injected faults, which retries and the infra-failure rule keep out of every
    stored answer) and, for the sandbox, the content of the worker profiles."""
    relevant = {
        k: v for k, v in worker_pool_config.items() if k not in ("cache", "usage_log", "faults")
    }
    sandbox = dict(relevant.get("sandbox") or {})
    profiles = sandbox.pop("profiles", None)
    sandbox.pop("tasks", None)
    sandbox.pop("torch_threads", None)
    relevant["sandbox"] = sandbox
    if profiles:
        path = Path(profiles) if Path(profiles).is_absolute() else root / profiles
        relevant["profiles_sha"] = (
            content_hash(path.read_bytes()) if path.is_file() else str(profiles)
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
        tasks = tasks_from_frame(test_tasks)
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
    candidate = (conductor_model_version or {}).get("model_uri")
    launch = contextlib.nullcontext()
    served_names: dict[str, str] = {}
    if config.policy_server == "vllm":
        plan = served_conductors(conductor_params, config, serving_params, candidate)
        conductor, base, champion, warm_start = (
            plan.conductor,
            plan.base,
            plan.champion,
            plan.warm_start,
        )
        launch, served_names = plan.server, plan.served_names
    else:
        conductor, base = build_policies(conductor_params, config, candidate)
        warm_start = warm_start_policy(conductor, conductor_params, config)
        champion = champion_policy(conductor, conductor_params, config)
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
    with launch, open_worker_pool(worker_pool_config, worker_credentials, root=root) as pool:
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
    if served_names:
        info["policy_server_models"] = served_names
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
