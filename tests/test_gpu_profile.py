"""The GPU profile (`kedro run --env gpu`) as its users run it, on the CPU.

conf/gpu's data_prep (on the benchmark fixtures), training (GRPO with vLLM generation off),
evaluation and promotion run in a throw-away copy of the project, with three swaps only:
the base model is the sandbox's SmolLM2-135M, the workers are the sandbox's simulated pool,
and `vllm serve` is a stand-in program (tests/fake_vllm_server.py) that serves what vLLM
would serve for the same command line and records every model name it is asked for. Sizes
are cut to a step of training and a question per benchmark.

What it pins down: the evaluation of version N asks the policy server for version N's
adapter, the champion's figures come from the champion's adapter, the base-policy
baseline asks for the base model by the name the server serves it under, and `conductor
serve --env gpu` afterwards launches the server with the adapter of the version promotion
left as champion and answers through it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path

import httpx
import pandas as pd
import pytest
import yaml

from tests.serving.conftest import ServeProcess

REPO = Path(__file__).resolve().parents[1]
GPU_MODEL = "conductor-qwen"  # the GPU profile's registered model (conf/gpu/globals.yml)
FIXTURES = REPO / "tests" / "fixtures" / "benchmarks"
SIMULATED = ["sim-sage", "sim-abacus", "sim-coder", "sim-sphinx", "sim-sprout"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _update(path: Path, change) -> None:
    """Edit one conf/gpu file in place (Kedro refuses a key defined twice in one env)."""
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _fixture(name: str) -> str:
    return str(FIXTURES / f"{name}.jsonl")


@pytest.fixture
def gpu_project(tmp_path, monkeypatch) -> dict:
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copytree(REPO / "conf", root / "conf", ignore=shutil.ignore_patterns("local"))
    for folder in ("conf/local", "src", "notebooks", "mlruns"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    gpu = root / "conf" / "gpu"
    port = _free_port()
    record = tmp_path / "policy_server_requests.jsonl"

    # `vllm serve` -> the stand-in, run by this interpreter
    program = tmp_path / "vllm"
    program.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" "{REPO / "tests" / "fake_vllm_server.py"}" "$@"\n'
    )
    program.chmod(0o755)

    def serving(data: dict) -> None:
        data["serving"]["vllm"].update(
            base_model="smollm2-135m-instruct",
            executable=str(program),
            port=port,
            env={"FAKE_VLLM_RECORD": str(record)},
            startup_timeout_s=60,
            request_timeout_s=30,
        )

    def conductor(data: dict) -> None:
        data["conductor"]["policy"]["api_base"] = f"http://127.0.0.1:{port}/v1"
        data["conductor"]["policy"]["timeout_s"] = 30
        data["conductor"]["sampling"]["max_tokens"] = 16

    def data_prep(data: dict) -> None:
        prep = data["data_prep"]
        for name, options in prep["sources"].items():
            options["data_files"] = _fixture(name)
        prep["domain_quota"] = {domain: 4 for domain in prep["domain_quota"]}
        prep["split_ratios"] = {"train": 0.5, "validation": 0.25, "test": 0.25}

    def training(data: dict) -> None:
        train = data["training"]
        train["base_model"] = "smollm2-135m-instruct"
        train["max_prompt_tokens"] = 4096
        train["grpo"].update(
            num_generations=2,
            prompts_per_step=1,
            micro_batch_size=2,
            max_steps=1,
            save_steps=1,
            max_completion_length=8,
            bf16=False,
            gradient_checkpointing=False,
            use_vllm=False,
            model_dtype="float32",
        )
        train["grpo"].pop("vllm_mode", None)
        train["grpo"].pop("vllm_gpu_memory_utilization", None)
        train["lora"].update(r=8, alpha=16, target_modules=["q_proj", "v_proj"])

    def evaluation(data: dict) -> None:
        evaluation = data["evaluation"]
        evaluation["benchmarks"] = {
            name: {"data_files": _fixture(name)} for name in ("aime25", "gpqa_diamond")
        }
        evaluation.update(
            test_per_domain=1,
            validation_per_domain=1,
            concurrency=4,
            trace_sample=1,
            metrics={"bootstrap_samples": 100, "confidence": 0.95},
        )
        evaluation["conductor"].update(in_flight=4)
        evaluation["best_of_n"] = {"worker": "auto", "n": "auto", "max_n": 2}

    def workers(data: dict) -> None:
        sandbox = yaml.safe_load((REPO / "conf/base/workers.yml").read_text())["worker_pool"]
        sandbox["sandbox"].update(workers=SIMULATED, load_real_model=False, latency_scale=0.0)
        # the simulated workers know the questions of this profile's splits (data/gpu)
        sandbox["sandbox"]["tasks"] = [
            path.replace("data/", "data/gpu/", 1) for path in sandbox["sandbox"]["tasks"]
        ]
        data.clear()
        data["worker_pool"] = sandbox

    for name, change in {
        "parameters_serving.yml": serving,
        "parameters_conductor.yml": conductor,
        "parameters_data_prep.yml": data_prep,
        "parameters_training.yml": training,
        "parameters_evaluation.yml": evaluation,
        "workers.yml": workers,
    }.items():
        _update(gpu / name, change)

    from conductor_pipeline.workers.local_model import DEFAULT_CACHE_RELATIVE, cache_complete

    # SmolLM2's plain (de-quantized) copy takes a minute to build on 2 cores: reuse the
    # checkout's copy when `make run` has made one (only read), else build one in the copy
    shared = REPO / DEFAULT_CACHE_RELATIVE
    if cache_complete(shared):
        monkeypatch.setenv("CONDUCTOR_MODEL_CACHE", str(shared))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("CONDUCTOR_POLICY_API_KEY", raising=False)
    monkeypatch.setenv("CONDUCTOR_PROJECT_ROOT", str(root))
    monkeypatch.chdir(root)
    return {"root": root, "record": record}


def _register_champion(root: Path) -> str:
    """Version 1 of the GPU profile's registered model (`conductor-qwen`, conf/gpu/globals.yml),
    aliased champion: an adapter from an earlier training run."""
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
    experiment = mlflow.create_experiment(
        "earlier-training", artifact_location=str(root / "mlruns" / "earlier")
    )
    adapter = root / "earlier_adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    with mlflow.start_run(experiment_id=experiment) as run:
        mlflow.log_artifacts(str(adapter), "adapter")
    client = mlflow.MlflowClient()
    client.create_registered_model(GPU_MODEL)
    version = client.create_model_version(
        GPU_MODEL, f"{run.info.artifact_uri}/adapter", run_id=run.info.run_id
    ).version
    client.set_model_version_tag(GPU_MODEL, version, "run_fingerprint", "earlier-run")
    client.set_registered_model_alias(GPU_MODEL, "champion", version)
    return str(version)


@pytest.mark.slow
def test_gpu_profile_evaluates_and_promotes_each_version_by_its_served_name(gpu_project):
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    from conductor_pipeline.pipeline_registry import register_pipelines

    root, record = gpu_project["root"], gpu_project["record"]
    champion = _register_champion(root)

    bootstrap_project(root)
    pipelines = register_pipelines()
    # the default loop without the HTML reports: data_prep -> training -> evaluation -> promotion
    reporting = {node.name for node in pipelines["reporting"].nodes}
    nodes = [n.name for n in pipelines["__default__"].nodes if n.name not in reporting]
    with KedroSession.create(project_path=root, env="gpu") as session:
        session.run(pipeline_names=["__default__"], node_names=nodes)

    # the policy server was launched by the pipeline and asked for exactly these names
    assert record.is_file(), "nothing asked the policy server for a model"
    asked = [json.loads(line)["model"] for line in record.read_text().splitlines()]
    info = json.loads((root / "data/gpu/08_reporting/evaluation_run_info.json").read_text())
    candidate = info["conductor_variant"].split("/")[1]
    assert info["conductor_variant"] == f"conductor/{candidate}" and candidate != champion
    assert info.get("champion_variant") == f"conductor/{champion}"
    served = {
        "conductor": f"conductor-v{candidate}",
        "champion": f"conductor-v{champion}",
        "base-policy": "conductor-base",
    }
    assert info["policy_server_models"] == served
    assert set(asked) == set(served.values()), asked

    summary = pd.read_csv(root / "data/gpu/08_reporting/evaluation_summary.csv").set_index("system")
    for system in ("conductor", "champion", "base-policy"):
        assert summary.loc[system, "parse_failures"] == 0, system

    decision = json.loads((root / "data/gpu/08_reporting/promotion_decision.json").read_text())
    assert decision["version"] == candidate
    assert "evaluated alongside the challenger" in decision["champion_source"]
    assert decision["figures"]["champion"] is not None

    # serving: `conductor serve --env gpu` launches the policy server with the champion the
    # promotion left and answers through that adapter
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
    champion_now = client.get_model_version_by_alias(GPU_MODEL, "champion")
    record.write_text("")
    key = "gpu-profile-test-key"
    env = {**os.environ, "CONDUCTOR_API_KEY": key, "PYTHONUNBUFFERED": "1"}
    server = ServeProcess(root, ["--env", "gpu"], env).start(timeout_s=180)
    try:
        response = httpx.post(
            f"{server.base_url}/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": "conductor", "messages": [{"role": "user", "content": "2 + 3 = ?"}]},
            timeout=120,
        )
    finally:
        server.stop()
    assert response.status_code == 200, response.text + server.output
    assert response.json()["conductor"]["model"]["version"] == str(champion_now.version)
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert calls and {c["model"] for c in calls} == {"conductor"}, calls
    served_adapter = Path(calls[0]["adapter"])
    registered = Path(
        mlflow.artifacts.download_artifacts(champion_now.source, tracking_uri=client.tracking_uri)
    )
    registered_config = next(registered.rglob("adapter_config.json"))
    assert (served_adapter / "adapter_config.json").read_bytes() == registered_config.read_bytes()
    assert (served_adapter / "adapter_model.safetensors").read_bytes() == (
        registered_config.parent / "adapter_model.safetensors"
    ).read_bytes()
