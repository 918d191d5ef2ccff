"""What a person sees at the end of `kedro run`: no ERROR line or known noise in the log,
and a run summary instead of the bare "Pipeline execution completed"."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from conductor_pipeline.run_summary import (
    MLFLOW_UI_COMMAND,
    UNKNOWN,
    RunActivity,
    RunSummaryHooks,
    run_summary,
)

REPO = Path(__file__).resolve().parents[1]
# the logging set-up the Makefile exports (its comment says why)
MAKEFILE_LOGGING = {
    "KEDRO_LOGGING_CONFIG": "$(CURDIR)/conf/base/logging.yml",
    "KEDRO_LOGGING_MODULE_ALLOWLIST": "conductor_pipeline.log_filters",
}


def _make_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CONDUCTOR_PROJECT_ROOT"}
    env.update({k: v.replace("$(CURDIR)", str(REPO)) for k, v in MAKEFILE_LOGGING.items()})
    env.update(COLUMNS="200", **extra)
    return env


# the noise `make run` printed before (issue 14), none of which may come back
KNOWN_NOISE = (
    "Task was destroyed but it is pending",
    "register_new_resolver() is deprecated",
    "Add type hints to the `predict` method",
    "Passing a Python object as `python_model`",
    "The tokenizer has new PAD/BOS/EOS tokens",
    "Ignoring clean_up_tokenization_spaces",  # turned off where the tokenizer loads
    "Loading weights",  # transformers' bar while a model's weights are read
    "Type hint used in the model's predict function",
    "An input example was not provided",
    "Replacing dataset",  # kedro-mlflow renaming a metrics dataset that had no prefix
    "Alternative text is missing",  # nbconvert, for a report figure without alt text
)

# `kedro run --pipelines evaluation` with a scripted Conductor (SmolLM2 would take minutes)
# against the real sandbox pool server, in a separate process so that Kedro configures its
# logging exactly as on the command line
RUNNER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {repo!r})
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    from conductor_pipeline.evaluation import PolicyUnderTest
    from conductor_pipeline.evaluation import conductors
    from tests.evaluation.fakes import ScriptedConductor

    def scripted(conductor_params, config, candidate=None):
        return (
            PolicyUnderTest(ScriptedConductor(math_worker=1), "scripted-v1", "scripted"),
            PolicyUnderTest(ScriptedConductor(math_worker=3), "scripted-base", "base"),
        )

    conductors.build_policies = scripted
    bootstrap_project({root!r})
    with KedroSession.create(project_path={root!r}) as session:
        session.run(pipeline_names=["evaluation"])
    """
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    from tests.evaluation.conftest import write_evaluation_project

    return write_evaluation_project(tmp_path / "project")


@pytest.mark.slow
def test_a_kedro_run_logs_no_error_no_known_noise_and_ends_with_the_summary(project):
    env = _make_env(MLFLOW_TRACKING_URI=f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    (project / "mlruns").mkdir()
    script = RUNNER.format(repo=str(REPO), root=str(project))
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    errors = [line for line in log.splitlines() if re.search(r"\bERROR\b", line)]
    assert errors == [], "\n".join(errors)
    for noise in KNOWN_NOISE:
        assert noise not in log, noise
    assert "\x1b[" not in log  # no raw ANSI colour codes (MLflow colours its warnings)
    summary = done.stdout[done.stdout.index("Run summary") :]
    assert "Ran: evaluation (" in summary
    # an evaluation-only run registers and promotes nothing, and says so
    assert "Registered: nothing" in summary and "Promotion: none in this run" in summary
    assert "was promoted" not in summary
    assert "Evaluation (test split, n=6): conductor" in summary
    assert "best baseline" in summary
    assert "data/08_reporting/evaluation_report.html" in summary
    assert MLFLOW_UI_COMMAND in summary


def test_the_makefile_exports_the_logging_set_up_the_run_test_uses():
    makefile = (REPO / "Makefile").read_text()
    for name, value in MAKEFILE_LOGGING.items():
        assert f"export {name} := {value}\n" in makefile


def test_the_noise_filter_drops_exactly_the_known_messages():
    import logging

    from conductor_pipeline.log_filters import KnownNoise

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, message, (), None)

    noise = KnownNoise()
    pending = "Task was destroyed but it is pending!\ntask: <Task pending coro=<{}() running>>"
    assert not noise.filter(record(pending.format("LoggingWorker._worker_loop")))
    assert noise.filter(record(pending.format("my_own_coroutine")))  # ours still shows
    assert not noise.filter(record("\x1b[33mAdd type hints to the `predict` method to ...\x1b[0m"))
    assert noise.filter(record("Node collect_tasks failed with error"))
    # in a notebook kernel: tqdm.auto's advice (MLflow imports it), kedro-mlflow's resolver
    tqdm = "TqdmWarning: IProgress not found. Please update jupyter and ipywidgets."
    assert not noise.filter(record(f".../tqdm/auto.py:21: {tqdm}"))
    assert not noise.filter(record("Registering new custom resolver: 'km.random_name'"))
    assert noise.filter(record("Mlflow run 'evaluation' - 'abc' has started"))


def _write_outputs(
    root: Path, rows: list[dict], decision: dict | None, data_root: str = "data"
) -> None:
    reporting = root / data_root / "08_reporting"
    reporting.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(reporting / "evaluation_summary.csv", index=False)
    if decision is not None:
        (reporting / "promotion_decision.json").write_text(json.dumps(decision))
    (reporting / "training_report.html").write_text("<html></html>")


def _row(system: str, accuracy: float, cost: float, p: float | None = None) -> dict:
    return {
        "system": system,
        "n": 96,
        "accuracy": accuracy,
        "ci_low": accuracy - 0.08,
        "ci_high": accuracy + 0.08,
        "cost_usd_per_q": cost,
        "p_value_vs_conductor": p,
    }


EVALUATED = frozenset({"evaluation_summary"})
EVERYTHING = frozenset({"evaluation_summary", "training_report", "evaluation_report"})


def test_the_summary_names_the_best_baseline_the_champion_and_the_reports(tmp_path):
    rows = [
        _row("conductor", 0.75, 0.000885),
        _row("warm-start", 0.29, 0.0001, 1e-9),
        _row("solo:sim-sage", 0.75, 0.000943, 1.0),
        _row("router", 0.833, 0.000183, 0.2),
        _row("oracle", 0.979, 0.000172, 1e-5),  # an upper bound, not a baseline
        _row("champion", 0.9, 0.0008, 0.01),  # the previous Conductor, not a baseline
    ]
    decision = {
        "version": "3",
        "decision": "kept",
        "champion": "2",
        "reasons": ["accuracy drop 0.06 > 0.05"],
    }
    _write_outputs(tmp_path, rows, decision)
    ran = RunActivity(("__default__",), 17, EVERYTHING, registered="3", decision=decision)
    text = run_summary(tmp_path, ran)
    assert "Ran: __default__ (17 nodes)" in text
    assert "Registered: conductor version 3 (models:/conductor/3)" in text
    assert "conductor 0.750 (95% CI 0.670-0.830, $0.000885/question)" in text
    assert "behind the best baseline by 0.083, p=0.2: router 0.833" in text
    assert "oracle" not in text and "champion 0.900" not in text
    assert "Champion: conductor version 2" in text
    assert "version 3, was kept (accuracy drop 0.06 > 0.05)" in text
    assert "Training report: data/08_reporting/training_report.html\n" in text
    assert "Evaluation report: data/08_reporting/evaluation_report.html (not written)" in text
    assert "MLflow UI: make mlflow  (then http://127.0.0.1:5000)" in text

    # the hand-written pipeline, when it is the best baseline, says it is told the domain
    told = tmp_path / "told"
    _write_outputs(told, [*rows, _row("handcrafted", 0.875, 0.0012, 0.05)], decision)
    assert "by 0.125, p=0.05: handcrafted (told the domain) 0.875" in run_summary(told, ran)


def test_the_summary_says_when_the_conductor_leads_and_when_outputs_are_missing(tmp_path):
    _write_outputs(tmp_path, [_row("conductor", 0.9, 0.001), _row("moa", 0.8, 0.002, 0.01)], None)
    text = run_summary(tmp_path, RunActivity(("evaluation",), 5, EVALUATED, champion=None))
    assert "ahead of the best baseline by 0.100, p=0.01: moa 0.800" in text
    assert "Promotion: none in this run; champion unchanged: none" in text
    empty = run_summary(tmp_path / "nothing", RunActivity(outputs=EVALUATED))
    assert "evaluation_summary.csv not written" in empty
    assert "champion unchanged: unknown" in empty  # the registry could not be read


def test_an_evaluation_only_run_claims_no_earlier_runs_promotion(tmp_path):
    """``make run ARGS="--pipelines evaluation"`` after a full run: the decision file on
    disk is the earlier run's; this run registered and promoted nothing."""
    earlier = {"version": "1", "decision": "promoted", "champion": "1", "reasons": []}
    _write_outputs(tmp_path, [_row("conductor", 0.9, 0.001)], earlier)
    (tmp_path / "data/08_reporting/evaluation_report.html").write_text("<html></html>")
    text = run_summary(tmp_path, RunActivity(("evaluation",), 6, EVALUATED, champion="1"))
    assert "Ran: evaluation (6 nodes)" in text
    assert "was promoted" not in text and "this run's" not in text
    assert "Registered: nothing (no training in this run)" in text
    assert (
        "Promotion: none in this run; champion unchanged: conductor version 1 "
        "(models:/conductor@champion)" in text
    )
    assert "Evaluation report: data/08_reporting/evaluation_report.html (from an earlier run)" in (
        text
    )


def test_the_hooks_record_what_this_run_registered_and_decided():
    from kedro.pipeline import Node, Pipeline

    def identity(value):
        return value

    pipeline = Pipeline([Node(identity, "evaluation_results", "evaluation_summary", name="n")])
    hooks = RunSummaryHooks()
    hooks.before_pipeline_run({"pipeline_names": ["evaluation"]}, pipeline, None)
    hooks.after_node_run(None, None, {}, {"evaluation_summary": "table"}, False, "r")
    evaluated = hooks.activity
    assert (evaluated.pipelines, evaluated.nodes, evaluated.outputs) == (
        ("evaluation",),
        1,
        frozenset({"evaluation_summary"}),
    )
    assert evaluated.registered is None and evaluated.decision is None
    assert evaluated.champion == UNKNOWN  # read at the end of the run, from the registry

    decision = {"version": "4", "decision": "promoted", "champion": "4", "reasons": []}
    hooks.before_pipeline_run({"pipeline_names": None}, pipeline, None)
    hooks.after_node_run(None, None, {}, {"conductor_model_version": {"version": 4}}, False, "r")
    hooks.after_node_run(None, None, {}, {"promotion_decision": decision}, False, "r")
    assert hooks.activity.pipelines == ("__default__",)
    assert (hooks.activity.registered, hooks.activity.decision) == ("4", decision)


def test_the_summary_of_a_gpu_run_reads_the_gpu_profiles_tree_and_model(tmp_path):
    decision = {"version": "2", "decision": "promoted", "champion": "2", "reasons": []}
    _write_outputs(tmp_path, [_row("conductor", 0.6, 0.02)], decision, "data/gpu")
    _write_outputs(tmp_path, [_row("conductor", 0.9, 0.001)], None)  # the sandbox's
    ran = RunActivity(("__default__",), 17, EVERYTHING, registered="2", decision=decision)
    text = run_summary(tmp_path, ran, data_root="data/gpu", registered_model="conductor-qwen")
    assert "conductor 0.600" in text and "conductor 0.900" not in text
    assert "Champion: conductor-qwen version 2 (models:/conductor-qwen@champion)" in text
    assert "Registered: conductor-qwen version 2 (models:/conductor-qwen/2)" in text
    assert "Training report: data/gpu/08_reporting/training_report.html\n" in text


# -- a missing prerequisite: one message naming the fix -----------------------------------------------


@pytest.mark.slow
def test_kedro_run_env_gpu_without_the_benchmarks_names_the_fix_without_a_traceback(tmp_path):
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    shutil.copytree(REPO / "conf", root / "conf", ignore=shutil.ignore_patterns("local"))
    (root / "conf" / "local").mkdir()
    (root / "mlruns").mkdir()
    env = _make_env(
        HF_HOME=str(tmp_path / "hf"),  # an empty Hugging Face cache: no benchmark is there
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlruns' / 'mlflow.db'}",
    )

    def failed_data_prep(*extra: str) -> str:
        kedro = Path(sys.executable).parent / "kedro"
        command = [str(kedro), "run", "--env", "gpu", "--pipelines", "data_prep", *extra]
        done = subprocess.run(
            command, cwd=root, env=env, capture_output=True, text=True, timeout=180
        )
        log = done.stdout + done.stderr
        assert done.returncode != 0
        assert "Traceback" not in log and 'File "' not in log, log[-3000:]
        return log

    log = failed_data_prep()
    # the preflight finds it before the first node, with every other missing source
    assert "Cannot run: the preflight checks found 4 problem(s) before the first step" in log
    assert "data_prep.sources.math500: does not load" in log
    assert "Fix: download it into the Hugging Face cache" in log
    assert "or give it a local copy with data_files" in log
    assert len(log.splitlines()) < 150
    # without the preflight, the node that loads it stops with the same fix, no traceback
    log = failed_data_prep("--params", "preflight.enabled=false")
    assert "Cannot run: data_prep.sources.math500: the dataset is not on this machine" in log
    assert "data_prep.sources.math500.data_files" in log


def test_setup_errors_are_found_through_wrapping_and_name_their_fix():
    from conductor_pipeline.setup_errors import (
        SetupError,
        check_gpu,
        find_setup_error,
        missing_key_error,
    )

    with pytest.raises(SetupError) as raised:
        check_gpu(["training.grpo.use_vllm"], cuda_available=False)
    assert "training.grpo.use_vllm need a CUDA GPU" in str(raised.value)
    assert "Fix: run `kedro run --env gpu` on a machine with an NVIDIA GPU" in str(raised.value)
    check_gpu(["training.grpo.use_vllm"], cuda_available=True)
    check_gpu([], cuda_available=False)

    try:
        try:
            raise raised.value
        except SetupError as inner:
            raise RuntimeError("wrapped by a runner") from inner
    except RuntimeError as outer:
        assert find_setup_error(outer) is raised.value
    assert find_setup_error(ValueError("other")) is None

    from conductor_pipeline.workers.config import WorkerConfigError

    key = missing_key_error(
        WorkerConfigError(
            "worker_pool.workers[2] (gpt-5): 'api_key_env' names the environment variable "
            "'OPENAI_API_KEY', which is not set"
        )
    )
    assert key is not None and "OPENAI_API_KEY" in str(key)
    assert "conf/local/credentials.yml" in key.fix
    assert "docs/sandbox.md, 'Adding a real provider'" in key.fix
    assert missing_key_error(WorkerConfigError("worker_pool.workers[0]: 'model' missing")) is None


def test_the_training_node_refuses_vllm_without_a_gpu_before_loading_anything(monkeypatch):
    from conductor_pipeline import setup_errors as preflight
    from conductor_pipeline.pipelines.training import nodes

    real_check = preflight.check_gpu
    monkeypatch.setattr(nodes, "check_gpu", lambda needed: real_check(needed, cuda_available=False))

    def no_pool(*args, **kwargs):
        raise AssertionError("the pool must not be opened")

    monkeypatch.setattr(nodes, "open_worker_pool", no_pool)
    with pytest.raises(preflight.SetupError, match="training.grpo.use_vllm"):
        nodes.train_conductor_node(
            pd.DataFrame(), {"grpo": {"use_vllm": True}}, None, {"kind": "sandbox"}, {}
        )
