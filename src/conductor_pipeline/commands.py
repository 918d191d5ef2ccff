"""What each ``conductor`` command does: ask the Conductor a question, serve the Conductor
API, run the sandbox worker server, promote or roll back a registered Conductor version,
check what a run needs (``preflight``), print what fixed strategies score in the sandbox.

``cli.py`` reads the command line and calls the ``cmd_*`` function of the command named;
each takes the parsed arguments and returns the exit status. Heavy imports stay inside the
functions, so that ``conductor --help`` answers at once.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

from conductor_pipeline.offline import apply_offline_defaults

apply_offline_defaults()  # the commands import litellm and transformers when they run

# `--adapter none`: ask the untrained base policy on purpose
BASE_POLICY = "none"
NO_TRAINED_CONDUCTOR = (
    "conductor ask: no trained Conductor to ask ({reason}). Run `make run` (it trains a "
    "Conductor and registers it as "
    "conductor@champion), or name one with --adapter <folder|models:/conductor/N>. "
    "To ask the untrained base policy on purpose (its workflows seldom parse), pass "
    "--adapter none."
)


def _print_event(kind: str, payload: Any) -> None:
    """Progress of ``conductor ask``, printed as the workflow runs."""
    if kind == "conductor_output":
        if payload.parse_error:
            print(
                f"Conductor sample {payload.round}.{payload.attempt} did not parse: {payload.parse_error}"
            )
        else:
            print(
                f"Conductor wrote a workflow (round {payload.round}, {payload.completion_tokens} tokens):"
            )
    elif kind == "workflow":
        for index, step in enumerate(payload.steps):
            sees = ",".join(map(str, step.access)) or "-"
            print(f"  step {index}: worker {step.worker}, sees [{sees}]: {step.subtask[:200]}")
    elif kind == "step_started":
        print(f"  … step {payload.index} running on {payload.worker_name or payload.worker}")
    elif kind in ("step_finished", "step_skipped"):
        status = payload.failure or payload.skipped_reason or "ok"
        answer = (payload.response or "").strip().replace("\n", " ")
        # a cached reply costs its list price, as evaluation charges it (PoolView)
        cost = f"${payload.cost_usd:.6f}" + (" (cached, list price)" if payload.cache_hit else "")
        print(
            f"  ✓ step {payload.index} [{status}] {payload.prompt_tokens + payload.completion_tokens} tokens, "
            f"{cost}, {payload.latency_s:.2f}s" + (f": {answer[:200]}" if answer else "")
        )


def pick_sample_question(data_dir: Path, seed: int) -> str:
    """A test-split question drawn with ``seed`` (``conductor ask --sample``)."""
    import random

    import pandas as pd

    path = data_dir / "05_model_input" / "test_tasks.parquet"
    if not path.is_file():
        raise SystemExit(f"--sample needs the prepared test split ({path}); run `make run` first.")
    questions = pd.read_parquet(path, columns=["question"])["question"].tolist()
    return random.Random(seed).choice(questions)


def _ask_adapter(adapter_arg: str | None, policy_params: dict[str, Any], root: Any) -> str | None:
    """The LoRA folder ``conductor ask`` loads, resolved as ``conductor serve`` resolves what
    it serves (:func:`~conductor_pipeline.serving.models.resolve_served_model`).

    ``--adapter`` must resolve; ``--adapter none`` is the base policy on purpose. Without
    ``--adapter``, a local policy whose configured reference (by default
    ``models:/conductor@champion``) does not resolve stops here with the fix, before
    minutes are spent on base-policy samples that do not parse;
    ``conductor.policy.adapter: null`` configures the base policy on purpose.
    """
    from conductor_pipeline.serving.models import ModelResolutionError, resolve_served_model

    if adapter_arg is not None:
        if adapter_arg.strip().lower() == BASE_POLICY:
            return None
        try:
            served = resolve_served_model(None, adapter_path=adapter_arg, explicit=True, root=root)
        except ModelResolutionError as err:
            # the registry's own reason; serve's advice about --model does not apply here
            raise SystemExit(f"conductor ask: {err.__cause__ or err}") from err
        return served.adapter_dir
    reference = policy_params.get("adapter")
    if not reference:
        return None
    # only the local policy loads the adapter; an endpoint or scripted policy ignores it
    required = policy_params.get("kind", "local") == "local"
    try:
        served = resolve_served_model(reference, explicit=required, root=root)
    except ModelResolutionError as err:
        reason = str(err.__cause__ or err).splitlines()[0]
        raise SystemExit(NO_TRAINED_CONDUCTOR.format(reason=reason)) from err
    return served.adapter_dir


def _notice(text: str) -> None:
    print(f"Note: {text}", file=sys.stderr, flush=True)


def cmd_ask(args: argparse.Namespace) -> int:
    from conductor_pipeline.evaluation.systems import PoolView
    from conductor_pipeline.project import load_project_config
    from conductor_pipeline.workers.runtime import open_worker_pool
    from conductor_pipeline.workers.sandbox.questions import simulation_marks
    from conductor_pipeline.workflow import orchestrate
    from conductor_pipeline.workflow.config import build_policy, orchestration_config

    config = load_project_config(args.env)
    params = dict(config.parameters["conductor"])
    orchestration = orchestration_config(params)
    if args.max_rounds is not None:
        orchestration.max_rounds = args.max_rounds
    # the profile's own split (--env gpu: data/gpu)
    question = pick_sample_question(config.data_dir, args.seed) if args.sample else args.question
    if not question:
        raise SystemExit("give a QUESTION or --sample")
    policy_params = dict(params.get("policy") or {})
    adapter = _ask_adapter(args.adapter, policy_params, config.root)
    policy = build_policy(policy_params, adapter_dir=adapter)
    if not args.json:
        print(f"Conductor: {policy.name}\nQuestion: {question}\n", flush=True)

    async def ask(pool: Any) -> tuple[Any, Any]:
        # before the run, which can take minutes: the warning is worth reading first
        checked = await pool.question_check(question) if pool.question_check else None
        if checked is not None and checked.warning:
            _notice(checked.warning)
        # evaluation's view of the pool: a reply from the response cache is charged its
        # list price (the pool reports $0 for it), so ask and evaluation cost a step alike
        priced = PoolView.from_pool(pool)
        result = await orchestrate(
            question,
            policy,
            priced.call,
            pool.descriptions,
            worker_names=pool.names,
            config=orchestration,
            on_event=None if args.json else _print_event,
        )
        return result, checked

    # the local policy loads while the worker pool starts (the sandbox loads its own model)
    with concurrent.futures.ThreadPoolExecutor(1) as loader:
        loading = loader.submit(policy.load) if hasattr(policy, "load") else None
        with open_worker_pool(config.worker_pool, config.credentials, root=config.root) as pool:
            if loading is not None:
                loading.result()
            result, checked = asyncio.run(ask(pool))
    # the same marks as the API's `conductor` record
    marks = simulation_marks(result, checked)
    record = result.to_dict()
    if args.json:
        record.update(marks)
        print(json.dumps(record, indent=2, default=str))
    elif result.format_failure:
        print("\nThe Conductor produced no valid workflow; no answer.")
    else:
        print(f"\nAnswer: {result.answer.strip()}", flush=True)
        if marks["warning"]:
            _notice("the answer above is made up by simulated workers (see the note before it).")
        cached = sum(
            step["cache_hit"]
            for r in record["rounds"]
            if r["execution"]
            for step in r["execution"]["steps"]
        )
        print(
            f"Total: {record['worker_calls']} worker calls, {record['tokens']} worker tokens, "
            f"${record['cost_usd']:.6f}"
            + (f" ({cached} cached, at list price)" if cached else "")
            + f", {record['latency_s']:.2f}s"
            + (" (simulated sim-* workers answered)" if marks["simulated"] else "")
        )
    return 2 if result.format_failure else 0


def cmd_sandbox(args: argparse.Namespace) -> int:
    from conductor_pipeline.project import load_project_config
    from conductor_pipeline.workers.sandbox import serve

    config = load_project_config(args.env)
    sandbox = config.worker_pool.get("sandbox") or {}
    tasks = [config.root / path for path in sandbox.get("tasks", [])]
    missing = [str(path) for path in tasks if not path.is_file()]
    if missing:
        raise SystemExit(f"sandbox tasks not found: {missing}; run `make run` first")
    serve(
        host=args.host,
        port=args.port,
        tasks_paths=tasks,
        profiles_path=config.root / sandbox.get("profiles", "conf/base/sandbox_workers.yml"),
        seed=int(sandbox.get("seed", 0)),
        latency_scale=float(
            sandbox.get("latency_scale", 1.0) if args.latency_scale is None else args.latency_scale
        ),
    )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from conductor_pipeline.serving.server import ServeError, main_error, serve

    try:
        return serve(
            env=args.env,
            host=args.host,
            port=args.port,
            model=args.model,
            adapter=args.adapter,
            policy_server=args.policy_server,
            max_concurrency=args.max_concurrency,
            log_level=logging.DEBUG if args.verbose else logging.INFO,
        )
    except (ServeError, ValueError, FileNotFoundError) as err:
        return main_error(err)


def cmd_promote(args: argparse.Namespace) -> int:
    """Gate a version (default: the challenger) from recorded figures, or roll back."""
    from conductor_pipeline import promotion
    from conductor_pipeline.project import load_project_config
    from conductor_pipeline.registry import use_registered_model

    config = load_project_config(args.env)
    use_registered_model(config.registered_model)  # --env gpu: conductor-qwen
    if args.rollback:
        try:
            moved = promotion.rollback()
        except LookupError as err:
            print(f"conductor promote --rollback: {err}", file=sys.stderr)
            return 1
        print(f"champion: conductor/{moved['from']} -> conductor/{moved['to']} (rolled back)")
        return 0

    from conductor_pipeline.pipelines.promotion.nodes import promote_recorded

    params = config.parameters.get("promotion") or {}
    try:
        outcome = promote_recorded(args.version, params)
    except (LookupError, ValueError) as err:
        print(f"conductor promote: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(outcome, indent=2, default=str))
    else:
        print(f"conductor/{outcome['version']}: {outcome['decision']}")
        for reason in outcome["reasons"]:
            print(f"  - {reason}")
        print(f"champion: {outcome['champion'] or 'none'}, challenger: {outcome['challenger']}")
    return 0 if outcome["decision"] in ("promoted", "unchanged") else 3


def cmd_preflight(args: argparse.Namespace) -> int:
    """The checks ``kedro run`` makes first with ``preflight.enabled``, alone: every worker,
    key and dataset of the profile; one line per problem, exit status 1 if any."""
    from conductor_pipeline.preflight import CHECKS, PreflightSettings, run_preflight
    from conductor_pipeline.project import load_project_config

    config = load_project_config(args.env)
    settings = PreflightSettings.from_params(config.parameters.get("preflight"))
    if args.hosted_completion is not None:
        settings = dataclasses.replace(settings, hosted_completion=args.hosted_completion)
    checks = args.checks or list(CHECKS)
    problems = run_preflight(
        dataclasses.replace(settings, checks=tuple(checks)),
        checks,
        config.parameters,
        config.worker_pool,
        config.credentials,
    )
    for problem in problems:
        print(f"- {problem}")
    print(f"preflight ({config.env}): {', '.join(checks)}: {len(problems)} problem(s)")
    return 1 if problems else 0


SPLITS = ("test", "validation", "train")
NO_SPLIT = (
    "conductor strategies: the {split} split is not prepared ({path}); "
    'run `make run ARGS="--pipelines data_prep"` first.'
)


def _strategy_lines(report: Any, split: str, profiles: str) -> list[str]:
    """``conductor strategies``' table: accuracy as 0.xxx, cost in µ$ per question."""
    table = report.table
    left_out = ", ".join(report.left_out) or "nothing"
    mc = (
        f"mc = the real workers and executor at {report.seeds} server seeds "
        "(µ$/q, calls/q measured there)"
        if report.seeds
        else "no mc run (--seeds 0), so no cost"
    )
    lines = [
        f"{split} split, {report.tasks} tasks: exact = expected accuracy from {profiles}; "
        f"{mc}; left out: {left_out} (a real model, no profile)",
        "specialists: "
        + ", ".join(f"{domain} {worker}" for domain, worker in report.specialists.items())
        + f"; checker: {report.checker}",
    ]
    if report.curriculum is not None:
        reference, share = report.curriculum
        lines.append(
            f"{reference} wrong / right = accuracy where {reference} alone answers wrong / "
            f"right; curriculum = the two mixed at {share:g} wrong (training.curriculum)"
        )

    def acc(value: float) -> str:
        return "-" if value != value else f"{value:.3f}"  # NaN: not measured

    width = max(len("strategy"), *(len(name) for name in table["strategy"]))
    header = ["steps", "exact", "easy", "medium", "hard", "mc", "µ$/q", "calls/q"]
    mix = ["reference_wrong", "reference_right", "curriculum"] if report.curriculum else []
    if mix:
        header += ["wrong", "right", "curriculum"]
    widths = [max(5, len(h)) for h in header]

    def line(name: str, cells: list[str]) -> str:
        return f"{name:<{width}}  " + "  ".join(
            f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)
        )

    lines.append(line("strategy", header))
    for row in table.to_dict(orient="records"):
        cost = row["cost_usd_per_q"]
        cells = [
            str(int(row["steps"])),
            acc(row["accuracy"]),
            acc(row["accuracy_easy"]),
            acc(row["accuracy_medium"]),
            acc(row["accuracy_hard"]),
            acc(row["mc_accuracy"]),
            "-" if cost != cost else f"{cost * 1e6:.0f}",
            "-" if cost != cost else f"{row['calls_per_q']:.1f}",
            *(acc(row[column]) for column in mix),
        ]
        lines.append(line(row["strategy"], cells))
    if report.seeds:
        off, pairs = int(table["mc_mismatches"].sum()), int(table["mc_pairs"].sum())
        lines.append(
            f"mc runs judged otherwise than the rule predicts from the luck drawn: {off} of {pairs}"
        )
    return lines


def cmd_strategies(args: argparse.Namespace) -> int:
    """Print what the sandbox rewards: exact and Monte-Carlo accuracy of fixed strategies."""
    import math

    from conductor_pipeline.evaluation.strategy_table import strategy_table
    from conductor_pipeline.paths import find_project_root
    from conductor_pipeline.workers.sandbox import (
        ProfileError,
        default_profiles_path,
        load_profiles,
        load_tasks,
    )

    if args.seeds < 0:
        print("conductor strategies: --seeds must be 0 or more", file=sys.stderr)
        return 2
    try:
        root = find_project_root()
        path = root / "data" / "05_model_input" / f"{args.split}_tasks.parquet"
        profiles_path = Path(args.profiles) if args.profiles else default_profiles_path()
        if not path.is_file():
            print(NO_SPLIT.format(split=args.split, path=path), file=sys.stderr)
            return 1
        profiles = load_profiles(profiles_path)
        report = strategy_table(
            profiles,
            load_tasks([path]),
            seeds=args.seeds,
            unsolved_share=args.unsolved_share,
            reference=args.reference_worker,
        )
    except (ProfileError, ValueError, OSError, RuntimeError) as err:
        print(f"conductor strategies: {err}", file=sys.stderr)
        return 1
    if args.json:
        rows = [
            {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            for row in report.table.to_dict(orient="records")
        ]
        record = {
            "split": args.split,
            "tasks": report.tasks,
            "seeds": report.seeds,
            "profiles": str(profiles_path),
            "specialists": report.specialists,
            "checker": report.checker,
            "left_out": report.left_out,
            "curriculum": (
                None
                if report.curriculum is None
                else {
                    "reference_worker": report.curriculum[0],
                    "unsolved_share": report.curriculum[1],
                }
            ),
            "strategies": rows,
        }
        print(json.dumps(record, indent=2))
    else:
        shown = profiles_path.resolve()
        if shown.is_relative_to(root.resolve()):
            shown = shown.relative_to(root.resolve())
        print("\n".join(_strategy_lines(report, args.split, str(shown))))
    return 0
