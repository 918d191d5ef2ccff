"""End to end: `kedro run --pipelines evaluation` in a copy of the project, against the real
sandbox server, with a scripted Conductor instead of SmolLM2."""

from __future__ import annotations

import json
import sqlite3

import pandas as pd
import pytest

from conductor_pipeline.evaluation import CONTRACT_COLUMNS, PolicyUnderTest

from .conftest import REPO, SANDBOX_WORKERS, write_evaluation_project
from .fakes import ScriptedConductor


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = write_evaluation_project(tmp_path / "project")
    monkeypatch.delenv("CONDUCTOR_PROJECT_ROOT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(root)
    return root


def _run(root, runtime_params=None):
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    bootstrap_project(root)
    with KedroSession.create(project_path=root, runtime_params=runtime_params) as session:
        session.run(pipeline_names=["evaluation"])


def _scripted_policies(conductor_params, config, candidate=None):
    return (
        PolicyUnderTest(ScriptedConductor(math_worker=1, two_steps=True), "scripted-v1", "test"),
        PolicyUnderTest(ScriptedConductor(math_worker=3), "scripted-base", "scripted base"),
    )


@pytest.mark.slow
def test_evaluation_pipeline_writes_the_contract_table_and_logs_to_mlflow(
    project, monkeypatch, capsys
):
    from conductor_pipeline.evaluation import conductors

    def scripted(conductor_params, config, candidate=None):
        policy = ScriptedConductor(math_worker=1, two_steps=True)
        return (
            PolicyUnderTest(policy, "scripted-v1", "scripted test conductor"),
            PolicyUnderTest(ScriptedConductor(math_worker=3), "scripted-base", "scripted base"),
        )

    monkeypatch.setattr(conductors, "build_policies", scripted)
    _run(project)

    summary = pd.read_csv(project / "data/08_reporting/evaluation_summary.csv")
    assert list(summary.columns[: len(CONTRACT_COLUMNS)]) == CONTRACT_COLUMNS
    expected = {
        "conductor",
        "conductor+recursion",
        "base-policy",
        *(f"solo:{w}" for w in SANDBOX_WORKERS),
        "moa",
        "random-workflow",
        "best-of-n:sim-sage",
        "router",
        "handcrafted",
        "oracle",
    }
    assert set(summary["system"]) == expected
    assert (summary["n"] == 6).all()
    assert summary["simulated_pool"].all()
    assert "p_value_vs_conductor" in summary.columns
    by_domain = pd.read_csv(project / "data/08_reporting/evaluation_summary_by_domain.csv")
    assert set(by_domain["domain"]) == {"math", "logic"}
    routing = pd.read_csv(project / "data/08_reporting/evaluation_routing.csv")
    assert set(routing["system"]) == {"conductor", "conductor+recursion", "base-policy"}
    assert {"math", "logic", "(all)"} == set(routing["domain"])
    checked = routing[(routing["system"] == "conductor") & (routing["kind"] == "shape")]
    assert checked.set_index(["domain", "value"]).loc[("(all)", "solve_check"), "share"] == 1.0
    per_question = pd.read_parquet(project / "data/08_reporting/evaluation_results.parquet")
    record = json.loads(per_question[per_question["system"] == "conductor"]["detail"].iloc[0])
    assert record["workflow"] and record["conductor_calls"]
    handcrafted = per_question[per_question["system"] == "handcrafted"]
    # each domain's solver (not the checker: auto picks another), then sim-sage checks
    assert len(handcrafted) == 6 and set(handcrafted["n_steps"]) == {2}
    assert {json.loads(d)["checker"] for d in handcrafted["detail"]} == {"sim-sage"}
    assert "sim-sage" not in {json.loads(d)["solver"] for d in handcrafted["detail"]}
    assert (project / "data/08_reporting/evaluation_pareto.png").stat().st_size > 10_000
    assert (project / "data/07_model_output/evaluation/results.jsonl").is_file()
    printed = capsys.readouterr().out
    assert "Evaluation summary" in printed and "best-of-n:sim-sage" in printed

    db = project / "mlruns" / "mlflow.db"
    with sqlite3.connect(db) as conn:
        metrics = dict(conn.execute("SELECT key, value FROM metrics").fetchall())
        params = dict(conn.execute("SELECT key, value FROM params").fetchall())
        traces = conn.execute("SELECT COUNT(*) FROM trace_info").fetchone()[0]
    assert metrics["eval.conductor.accuracy"] == pytest.approx(
        summary.set_index("system").loc["conductor", "accuracy"]
    )
    assert "eval.conductor_recursion.accuracy" in metrics
    assert "eval.solo:sim-sage.p_value_vs_conductor" in metrics
    assert "evaluation.test_per_domain" in params
    # Settings about keys may be logged (which variable holds one, whether one is required);
    # nothing else that names a credential, and no value that looks like a key.
    about_keys = {p: v for p, v in params.items() if "credential" in p or "api_key" in p}
    assert all(p.endswith(("api_key_env", "require_api_key")) for p in about_keys), about_keys
    assert all(v.isupper() or v in {"True", "False"} for v in about_keys.values()), about_keys
    assert traces == 2
    artifacts = {p.name for p in (project / "mlruns").rglob("*") if p.is_file()}
    assert {
        "evaluation_summary.csv",
        "evaluation_pareto.png",
        "evaluation_results.parquet",
        "evaluation_routing.csv",
    } <= artifacts

    # a second run reuses every stored pair
    _run(project)
    info = json.loads((project / "data/08_reporting/evaluation_run_info.json").read_text())
    assert info["pairs_run"] == 0
    # the result store named relative to the project (a moved project shows no old folder)
    assert info["store"] == "data/07_model_output/evaluation/results.jsonl"
    # the hand-written pipeline's choice is in the run info: sim-sage (the dearest) checks
    assert set(info["handcrafted"]) == {"math", "logic"}
    assert all(checker == "sim-sage" for _, checker in info["handcrafted"].values())


@pytest.mark.slow
def test_faults_from_runtime_params_change_no_answer(project, monkeypatch):
    """`kedro run --params "worker_pool.faults..."`: 30 % faults reach the evaluation's pool
    (the run info says what was injected), and the per-question answers and the summary
    are those of a run without faults."""
    from conductor_pipeline.evaluation import conductors

    monkeypatch.setattr(conductors, "build_policies", _scripted_policies)
    rates = {"timeout": 0.1, "rate_limit": 0.1, "provider_error": 0.1}
    # three systems are enough to see the params arrive; every system under faults is
    # compared in tests/evaluation/test_faults.py
    systems = {"evaluation": {"systems": ["conductor", "solo", "moa", "oracle"]}}
    _run(project, {**systems, "worker_pool": {"faults": {"seed": 3, "rates": rates}}})
    info = json.loads((project / "data/08_reporting/evaluation_run_info.json").read_text())
    injected = info["injected_faults"]
    assert injected["level"] == "provider" and injected["rates"] == rates
    assert sum(injected["injected"].values()) > 0
    assert info["infra_failed_pairs"] == 0
    faulty = pd.read_parquet(project / "data/08_reporting/evaluation_results.parquet")
    faulty_summary = pd.read_csv(project / "data/08_reporting/evaluation_summary.csv")

    # the same evaluation without faults, from scratch
    (project / "data/07_model_output/evaluation/results.jsonl").unlink()
    (project / "data/03_primary/response_cache.sqlite").unlink()
    _run(project, systems)
    info = json.loads((project / "data/08_reporting/evaluation_run_info.json").read_text())
    assert "injected_faults" not in info and info["pairs_run"] > 0
    clean = pd.read_parquet(project / "data/08_reporting/evaluation_results.parquet")
    clean_summary = pd.read_csv(project / "data/08_reporting/evaluation_summary.csv")
    key = ["system", "split", "question_id"]
    columns = [*key, "variant", "answer", "correct", "infra_failure"]
    assert (
        faulty[columns]
        .sort_values(key)
        .reset_index(drop=True)
        .equals(clean[columns].sort_values(key).reset_index(drop=True))
    )
    table = ["system", "n", "accuracy", "ci_low", "ci_high", "infra_failures"]
    assert faulty_summary[table].equals(clean_summary[table])


def test_benchmark_questions_come_from_the_loaders_without_training_overlap():
    from conductor_pipeline.evaluation import EvaluationConfig
    from conductor_pipeline.evaluation.inputs import evaluation_questions
    from conductor_pipeline.tasks.sources import load_source

    fixtures = REPO / "tests/fixtures/benchmarks"
    names = ["math500", "mmlu", "aime25", "gpqa_diamond"]
    config = EvaluationConfig.from_params(
        {
            "benchmarks": {n: {"data_files": str(fixtures / f"{n}.jsonl")} for n in names},
            "report_by": "source",
            "test_per_domain": 2,
        }
    )
    trained = load_source("math500", data_files=str(fixtures / "math500.jsonl"))[:4]
    train = pd.DataFrame([t.to_record() for t in trained])
    empty = train.iloc[:0]
    questions = evaluation_questions(config, empty, train, empty)
    by_source = pd.Series([t.source for t in questions]).value_counts().to_dict()
    assert by_source == {"math500": 1, "mmlu": 2, "aime25": 2, "gpqa_diamond": 2}
    assert not {t.question for t in questions} & {t.question for t in trained}
