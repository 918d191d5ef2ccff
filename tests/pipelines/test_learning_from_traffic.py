"""Learning from traffic: the retraining nodes of the growing sources (captured requests with
feedback join the training split, verdicts form the new slice, watermarks move only at the
commit), the promotion gate on the new slice, and (slow) the whole loop on the sandbox:
``conductor serve`` with capture on, feedback over HTTP, the retraining pipeline run twice."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

from conductor_pipeline import promotion
from conductor_pipeline.pipelines.retraining.sources import (
    collect_retraining_sources,
    commit_source_watermarks,
    evaluate_traffic_slice,
)
from conductor_pipeline.promotion import Decision, Figures, Gates
from conductor_pipeline.serving.capture import CaptureSettings, capture_record
from conductor_pipeline.serving.feedback import open_stores, parse_feedback
from conductor_pipeline.tasks import Task
from conductor_pipeline.tasks.splits import normalise_question
from tests.pipelines.test_promotion_pipeline import promote, summary, tags

REPO = Path(__file__).resolve().parents[2]
TEST_QUESTION = "What is 17 + 25?"


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDUCTOR_PROJECT_ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # project_root() is memoised per working directory
    return tmp_path


def frame(*tasks: Task) -> pd.DataFrame:
    return pd.DataFrame([t.to_record() for t in tasks], columns=list(Task.__dataclass_fields__))


TRAIN = frame(Task("rg/1", "math", "easy", "What is 2 + 2?", "4", "number", "numeric", "rg"))
TEST = frame(Task("rg/2", "math", "easy", TEST_QUESTION, "42", "number", "numeric", "rg"))
PARAMS = {
    "watermarks": {"store": "file", "path": "data/watermarks.json"},
    "traffic": {"enabled": True, "path": "data/01_raw/traffic"},
}


def serve_and_judge(root: Path, exchanges: list[tuple[str, str, dict]]) -> None:
    """Write what a server with capture on writes: each (question, answer) captured, then the
    feedback body (without its id) posted on it."""
    capture, feedback = open_stores(CaptureSettings(enabled=True), root)
    for number, (question, answer, body) in enumerate(exchanges):
        request_id = f"chatcmpl-{len(capture.records()) + number:04d}"
        record = {"request_id": request_id, "model": {"id": "conductor/3"}, "steps": []}
        capture.append(capture_record(question, answer, record))
        status, _ = feedback.submit(parse_feedback({"request_id": request_id, **body}))
        assert status == 200


def test_traffic_joins_training_the_slice_is_kept_apart_and_a_rerun_is_unchanged(root):
    serve_and_judge(
        root,
        [
            ("Compute 6 * 7.", "It is 42.", {"reference_answer": "42"}),
            (TEST_QUESTION, "42", {"reference_answer": "42"}),  # the anchor: left out
            ("What is 2 + 2?", "4", {"reference_answer": "4"}),  # already in training
            ("Name a prime above 10.", "Answer: 11", {"verdict": "right"}),
            ("Spell cat backwards.", "tac", {"verdict": "wrong"}),
        ],
    )
    joined, new_slice, report = collect_retraining_sources(TRAIN, TEST, {"token": "t"}, PARAMS)
    questions = list(joined["question"])
    assert questions == ["What is 2 + 2?", "Compute 6 * 7."]
    assert joined.iloc[1]["id"].startswith("traffic/") and joined.iloc[1]["answer"] == "42"
    assert list(new_slice["question"]) == ["Name a prime above 10."]
    assert new_slice.iloc[0]["answer"] == "11"
    assert report["unchanged"] is False and report["added_to_training"] == 1
    assert report["evaluation_slice"] == {
        "tasks": 1, "right": 1, "wrong": 1, "scores": 0, "mean_score": None
    }  # fmt: skip
    [traffic] = report["sources"]
    assert traffic["in_test_split"] == 1 and len(report["already_in_training"]) == 1
    assert "Compute 6 * 7." not in json.dumps(report)  # counts, ids and watermarks only

    # nothing moves before the commit: a failed run reads the same again
    assert not (root / "data" / "watermarks.json").exists()
    again, _, _ = collect_retraining_sources(TRAIN, TEST, {"token": "t"}, PARAMS)
    assert len(again) == 2

    done = commit_source_watermarks(report, {"decision": "promoted"}, "<html>", "<html>", PARAMS)
    assert done == {
        "moved": ["traffic"],
        "unchanged": False,
        "decision": "promoted",
        "reports_rendered": True,
    }
    stored = json.loads((root / "data" / "watermarks.json").read_text())
    assert stored["traffic"] == traffic["watermark"]

    rerun, rerun_slice, rerun_report = collect_retraining_sources(
        TRAIN, TEST, {"token": "u"}, PARAMS
    )
    assert rerun.equals(TRAIN) and rerun_slice.empty and rerun_report["unchanged"] is True
    moved = commit_source_watermarks(rerun_report, {}, "<html>", "<html>", PARAMS)
    assert moved["moved"] == [] and moved["unchanged"] is True


def test_bad_source_settings_name_the_key(root):
    with pytest.raises(
        ValueError,
        match=r"retraining_sources\.traffic: unknown key 'enabeld' \(did you mean 'enabled'\?\)",
    ):
        collect_retraining_sources(TRAIN, TEST, {}, {"traffic": {"enabeld": True}})


def test_an_empty_slice_is_evaluated_by_nobody():
    results, figures = evaluate_traffic_slice(
        frame(), TRAIN, frame(), {}, {}, {}, {}, {}, {"model_uri": "models:/conductor/2"}
    )
    assert (
        results.empty
        and figures["questions"] == 0
        and "no new evaluation slice" in (figures["skipped"])
    )


# ------------------------------------------------------------------------------ the gate


def decision(**gates: float) -> Decision:
    figures = Figures(accuracy=0.5, cost_usd_per_q=0.002, parse_rate=1.0, n=12)
    return promotion.decide(figures, figures, Gates(**gates))


def on_slice(challenger: float, champion: float) -> dict:
    return {
        "questions": 10,
        "skipped": None,
        "challenger": {"accuracy": challenger, "n": 10},
        "champion": {"accuracy": champion, "n": 10},
    }


@pytest.mark.parametrize(
    ("challenger", "champion", "tolerance", "passes"),
    [(0.8, 0.7, 0.0, True), (0.7, 0.7, 0.0, True), (0.6, 0.7, 0.0, False), (0.6, 0.7, 0.1, True)],
)
def test_the_new_slice_asks_for_improvement_or_parity(challenger, champion, tolerance, passes):
    made = decision(max_slice_accuracy_drop=tolerance)
    assert made.promote
    assert promotion.gate_new_slice(made, on_slice(challenger, champion)) is None
    assert made.checks["new_slice"] is passes and made.promote is passes
    assert "new slice (10 served questions)" in made.reasons[-1]


def test_the_slice_gate_is_skipped_with_its_reason():
    made = decision()
    reason = promotion.gate_new_slice(made, {"questions": 0, "skipped": "no new slice"})
    assert reason == "no new slice" and made.promote and "new_slice" not in made.checks
    assert made.reasons[-1] == "new-slice gate skipped: no new slice"
    half = decision()
    assert "both versions" in promotion.gate_new_slice(half, {"challenger": {"accuracy": 1}})
    assert half.promote


def test_promotion_refuses_a_version_that_regresses_on_the_new_slice(registry):
    first, second, third = registry
    promote(first, summary(0.5))
    params = {"gates": {"max_accuracy_drop": 0.05, "max_slice_accuracy_drop": 0.0}}
    from conductor_pipeline.pipelines.promotion.nodes import promote_challenger
    from tests.pipelines.test_promotion_pipeline import results, run_info

    refused = promote_challenger(
        summary(0.6), run_info(second), results(), params, on_slice(0.5, 0.8)
    )
    assert refused["decision"] == "refused" and refused["new_slice"]["champion"]["accuracy"] == 0.8
    assert (
        "new slice (10 served questions): accuracy 0.500 vs champion 0.800"
        in (tags(second)["promotion.reason"])
    )
    skipped = promote_challenger(
        summary(0.6), run_info(third), results(), params, {"questions": 0, "skipped": "none new"}
    )
    assert skipped["decision"] == "promoted"
    assert "new-slice gate skipped: none new" in skipped["reasons"]


# ------------------------------------------------------------------ end to end on the sandbox

# A Conductor adapter `make run` trained and promoted (tests/fixtures/champion_adapter/README.md)
CHAMPION_ADAPTER = REPO / "tests" / "fixtures" / "champion_adapter"


def _write(path: Path, data: dict) -> None:
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _sandbox_project(root: Path) -> Path:
    """The base configuration on a small sandbox: the simulated workers only (they also know
    the prepared tasks in ``served_tasks.parquet``, not only the split ones), capture on, the
    traffic source on, and training and evaluation cut to a GRPO step (no curriculum
    pre-pass) and a question per domain. The Conductor is the configured default: SmolLM2
    with the champion's adapter."""
    (root / "conf" / "local").mkdir(parents=True)
    (root / "src").mkdir()
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copytree(REPO / "conf" / "base", root / "conf" / "base")
    shutil.copytree(REPO / "notebooks", root / "notebooks")  # the report notebooks
    local = root / "conf" / "local"

    def base(name: str) -> dict:
        return yaml.safe_load((REPO / "conf" / "base" / name).read_text())

    pool = base("workers.yml")
    sandbox = pool["worker_pool"]["sandbox"]
    sandbox.update(load_real_model=False, latency_scale=0.0)
    sandbox["workers"] = ["sim-sage", "sim-abacus", "sim-coder", "sim-sphinx", "sim-sprout"]
    sandbox["tasks"] = [*sandbox["tasks"], "data/01_raw/served_tasks.parquet"]
    _write(local / "workers.yml", pool)
    training = base("parameters_training.yml")
    training["training"]["grpo"].update(
        num_generations=2, prompts_per_step=1, max_steps=1, save_steps=1, max_completion_length=16
    )
    # no reference pre-pass: for one GRPO step it asked sim-sage all 303 training questions
    # (16 s); the curriculum has tests of its own
    training["training"]["curriculum"] = {"reference_worker": None}
    _write(local / "parameters_training.yml", training)
    evaluation = base("parameters_evaluation.yml")
    evaluation["evaluation"].update(
        test_per_domain=1,
        validation_per_domain=1,
        systems=["conductor", "champion", "solo", "oracle"],
        metrics={"bootstrap_samples": 100, "confidence": 0.95},
        trace_sample=0,
    )
    _write(local / "parameters_evaluation.yml", evaluation)
    _write(local / "parameters_serving.yml", {"serving": {"capture": {"enabled": True}}})
    _write(
        local / "parameters_retraining.yml",
        {"retraining_sources": {"traffic": {"enabled": True}}},
    )
    return root


def _register_champion(project: Path) -> str:
    """Register the trained adapter as training does (``register_conductor``) in the
    project's own store and make it champion; returns the version."""
    import mlflow

    from conductor_pipeline.pipelines.training.nodes import register_conductor

    adapter = project / "data" / "06_models" / "champion" / "adapter"
    shutil.copytree(CHAMPION_ADAPTER, adapter, ignore=shutil.ignore_patterns("README.md"))
    mlflow.set_tracking_uri(f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")
    mlflow.set_experiment("conductor-champion")
    info = {
        "adapter_dir": str(adapter),
        "base_model": "smollm2-135m-instruct",
        "pool_fingerprint": "make-run",
        "data_version": "make-run",
        "config_fingerprint": "make-run",
        "run_fingerprint": "make-run",
        "global_step": 14,
        "worker_names": ["sim-sage", "sim-abacus", "sim-coder", "sim-sphinx", "sim-sprout"],
    }
    version = str(register_conductor(info)["version"])
    mlflow.MlflowClient().set_registered_model_alias("conductor", "champion", version)
    return version


def _kedro(project: Path, *args: str) -> None:
    env = {
        **os.environ,
        "CONDUCTOR_PROJECT_ROOT": str(project),
        "KEDRO_DISABLE_TELEMETRY": "true",
    }
    env.pop("MLFLOW_TRACKING_URI", None)  # the project's own store (conf/base/mlflow.yml)
    done = subprocess.run(
        [sys.executable, "-m", "kedro", "run", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def _read(project: Path, name: str) -> pd.DataFrame:
    return pd.read_parquet(project / "data" / "05_model_input" / f"{name}.parquet")


def _store(project: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")


def _watermark(project: Path) -> str | None:
    experiment = _store(project).get_experiment_by_name("conductor-retraining")
    return None if experiment is None else experiment.tags.get("watermark.traffic")


def _data_version(tasks: pd.DataFrame) -> str:
    from conductor_pipeline.training.inputs import data_version

    return data_version([Task.from_record(row) for row in tasks.to_dict("records")])


def _new_tasks(project: Path) -> pd.DataFrame:
    """Six prepared tasks that data_prep left out of the splits (numeric answers): what the
    users of the served Conductor ask about."""
    raw = pd.read_parquet(project / "data" / "01_raw" / "tasks.parquet")
    in_splits = {
        normalise_question(q)
        for name in ("train", "validation", "test")
        for q in _read(project, f"{name}_tasks")["question"]
    }
    # questions the sources count as one (same normalised text) would make a repeat
    raw["key"] = raw["question"].map(normalise_question)
    unsplit = raw[~raw["key"].isin(in_splits) & (raw["answer_format"] == "number")]
    chosen = unsplit.drop_duplicates("key").sort_values("id").head(6).drop(columns="key")
    assert len(chosen) == 6, "the prepared tasks left out of the splits are the new questions"
    return chosen


@pytest.mark.slow
def test_served_traffic_with_feedback_reaches_the_next_retraining(tmp_path, monkeypatch):
    """Serve the champion with capture on, ask prepared questions, send feedback through the
    OpenAI client, run the retraining pipeline: the questions with a reference answer are in
    the training data of the version it trains, those judged right in its evaluation slice
    (both versions evaluated on it), the test-split question in neither, the watermark moved;
    the next run's sources, with no new traffic, add nothing and record ``unchanged``."""
    from openai import OpenAI

    from tests.serving.conftest import ServeProcess, serve_env

    project = _sandbox_project(tmp_path / "project")
    _kedro(project, "--pipelines", "data_prep")
    chosen = _new_tasks(project)
    chosen.to_parquet(project / "data" / "01_raw" / "served_tasks.parquet")
    anchor = _read(project, "test_tasks").iloc[0]
    monkeypatch.setenv("CONDUCTOR_PROJECT_ROOT", str(project))
    monkeypatch.chdir(project)
    champion = _register_champion(project)

    key = "sk-e2e-traffic-5c2a9e71"
    env = serve_env(tmp_path, CONDUCTOR_API_KEY=key)
    env.pop("MLFLOW_TRACKING_URI")  # the champion is in the project's store
    process = ServeProcess(project, [], env).start(timeout_s=300)
    try:
        client = OpenAI(base_url=process.base_url, api_key=key, max_retries=0, timeout=120)

        def ask(question: str) -> str:
            reply = client.chat.completions.create(
                model="conductor", messages=[{"role": "user", "content": question}]
            )
            served = reply.model_extra["conductor"]["model"]
            assert (served["version"], served["alias"]) == (champion, "champion")
            return reply.id

        def feedback(request_id: str, **body: object) -> dict:
            sent = client.post(
                "/feedback", cast_to=httpx.Response, body={"request_id": request_id, **body}
            )
            return sent.json()

        references, judged = chosen.iloc[:3], chosen.iloc[3:]
        for task in references.itertuples():
            reply = feedback(ask(task.question), reference_answer=task.answer)
            assert reply["joinable"] and reply["kind"] == "reference_answer"
        verdicts = ["right", "right", "wrong"]
        for task, verdict in zip(judged.itertuples(), verdicts, strict=True):
            assert feedback(ask(task.question), verdict=verdict)["kind"] == "verdict"
        feedback(ask(anchor["question"]), reference_answer=str(anchor["answer"]))
    finally:
        assert process.stop() == 0, process.output
    assert key not in "".join(
        path.read_text() for path in (project / "data" / "01_raw" / "traffic").iterdir()
    )

    assert _watermark(project) is None
    _kedro(project, "--pipelines", "retraining")
    train, joined = _read(project, "train_tasks"), _read(project, "retraining_train_tasks")
    added = joined.iloc[len(train) :]
    assert sorted(added["question"]) == sorted(references["question"])
    assert all(added["id"].str.startswith("traffic/")) and anchor["question"] not in set(
        joined["question"]
    )
    assert list(added.sort_values("question")["answer"]) == list(
        references.sort_values("question")["answer"]
    )
    reporting = project / "data" / "08_reporting"
    # the version this run trained learned from the joined split, starting from the champion
    registered = project / "data" / "06_models" / "conductor" / "registered_model.json"
    trained = json.loads(registered.read_text())
    assert trained["version"] != champion
    tags = _store(project).get_model_version("conductor", trained["version"]).tags
    assert tags["data_version"] == _data_version(joined)
    new_slice = _read(project, "traffic_slice_tasks")
    assert sorted(new_slice["question"]) == sorted(judged["question"].iloc[:2])
    figures = json.loads((reporting / "traffic_slice_figures.json").read_text())
    assert figures["questions"] == 2 and figures["skipped"] is None
    assert figures["challenger"]["n"] == 2 and figures["champion"]["n"] == 2
    decision = json.loads((reporting / "promotion_decision.json").read_text())
    assert decision["version"] == trained["version"] and decision["new_slice"]["questions"] == 2
    report = json.loads((reporting / "retraining_sources_report.json").read_text())
    [traffic] = report["sources"]
    assert report["unchanged"] is False and traffic["in_test_split"] == 1
    first_mark = _watermark(project)
    assert first_mark and first_mark == traffic["watermark"]
    run_report = json.loads((reporting / "retraining_report.json").read_text())
    assert run_report["sources"]["moved"] == ["traffic"] and run_report["lock_released"]
    assert run_report["sources"]["reports_rendered"]

    # the next scheduled run, as far as the sources go (its first and last node, in process:
    # a second whole run costs 80 s of training and evaluation on nothing new), reading the
    # watermark the first run left in the project's MLflow store
    from conductor_pipeline.project import load_project_config

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params = load_project_config().parameters["retraining_sources"]
    train, validation, test = (
        _read(project, f"{n}_tasks") for n in ("train", "validation", "test")
    )
    joined, new_slice, again = collect_retraining_sources(
        train, test, {"token": "next"}, params, validation
    )
    assert again["unchanged"] is True and again["tasks"] == 0
    assert joined.equals(train) and new_slice.empty
    rerun = commit_source_watermarks(again, {"decision": "refused"}, "<html>", "<html>", params)
    assert rerun["moved"] == [] and rerun["unchanged"] is True
    assert _watermark(project) == first_mark


def test_training_and_evaluation_read_the_joined_split_and_the_commit_waits_for_the_run():
    from conductor_pipeline.pipeline_registry import register_pipelines

    pipelines = register_pipelines()
    retraining = pipelines["retraining"]
    nodes = {node.name: node for node in retraining.nodes}
    for name in ("train_conductor", "run_evaluation", "evaluate_traffic_slice"):
        assert "retraining_train_tasks" in nodes[name].inputs
        assert "train_tasks" not in nodes[name].inputs
    assert "traffic_slice_figures" in nodes["promote_challenger"].inputs
    order = [node.name for node in retraining.nodes]  # topological
    commit = order.index("commit_source_watermarks")
    for earlier in ("promote_challenger", "render_training_report", "render_evaluation_report"):
        assert order.index(earlier) < commit
    assert order[-1] == "release_retraining_lock"
    assert "retraining_watermarks" in nodes["release_retraining_lock"].inputs
    # the default pipeline (make run) gates on the test split only, as before
    default = {node.name: node for node in pipelines["__default__"].nodes}
    assert "traffic_slice_figures" not in default["promote_challenger"].inputs
    assert "train_tasks" in default["train_conductor"].inputs
