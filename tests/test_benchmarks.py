"""`make bench` keeps working: the quick suites run through the module entry point and write
their figures into the JSON report (the figures themselves are not asserted: speed is
measured, never tested)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_quick_benchmarks_write_their_figures(tmp_path):
    output = tmp_path / "benchmarks.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "conductor_pipeline.benchmarks",
            "rewards",
            "executor",
            "--output",
            str(output),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(output.read_text())
    assert set(report["machine"]) >= {"cpu_count", "cpu_model", "cpu_extensions"}
    results = report["results"]
    rewards = results["rewards"]
    assert rewards["rollouts"] == 64 and rewards["worker_calls_per_pass"] == 96
    assert rewards["cold_cache_rollouts_per_s"] > 0 and rewards["warm_cache_rollouts_per_s"] > 0
    assert results["executor"]["overhead_per_step_ms"] > 0


def test_the_cpu_description_names_the_model_and_its_matrix_extensions(tmp_path):
    from conductor_pipeline.benchmarks.__main__ import cpu_description

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n\n"
        "processor\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n"
    )
    assert cpu_description(cpuinfo) == {"cpu_model": "AMD EPYC", "cpu_extensions": ["avx2"]}
    assert cpu_description(tmp_path / "missing")["cpu_extensions"] == []


@pytest.mark.slow
def test_training_benchmark_runs_on_a_tiny_model(tiny_model_dir, tmp_path):
    """The `training` suite's measurement in a reduced mode (tiny random Llama, one
    measured step, groups of two): both trainers train, the project's fast paths serve
    every generation and scoring call, and the report has its figures."""
    import torch

    from conductor_pipeline.benchmarks.training import training_step_benchmark
    from conductor_pipeline.training.configs import TrainingConfig
    from conductor_pipeline.workflow import PromptConfig

    config = TrainingConfig.from_params(
        {
            "base_model": str(tiny_model_dir),
            "output_dir": str(tmp_path),
            "grpo": {"num_generations": 2, "prompts_per_step": 2, "max_completion_length": 8},
            "lora": {"r": 4, "alpha": 8, "last_layers": 1},
        }
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on a shared 2-core box: one thread is faster
    try:
        figures = training_step_benchmark(
            config,
            PromptConfig(question_to_workers=True, few_shot=[]),
            [f"worker {i}" for i in range(6)],
            steps=1,
        )
    finally:
        torch.set_num_threads(threads)
    assert figures["project_fast_path_calls"] == {"generation": 2, "scoring": 2}
    assert figures["steps_measured"] == 1 and figures["num_generations"] == 2
    for key in ("stock", "project"):
        assert figures[f"{key}_step_s"] > 0 and figures[f"{key}_generation_s"] > 0
        assert figures[f"{key}_completion_tokens_mean"] > 0
    assert figures["step_cost_ratio"] > 0 and figures["prompt_tokens_min"] > 0


def test_the_real_policy_serving_case_reports_one_users_latency(tmp_path):
    """The serving suite's real-policy measurement, run here over the scripted policy and a
    small sandbox (the real model's speed is measured by `make bench`, not tested): the
    start-up warm-up runs when asked, every request is answered, and the report holds the
    first-request and warm figures with their breakdown."""
    import asyncio

    from conductor_pipeline.benchmarks import bench_tasks
    from conductor_pipeline.benchmarks.serving import serve_one_user
    from conductor_pipeline.serving.models import ServedModel
    from conductor_pipeline.workers import WorkerPool
    from conductor_pipeline.workers.sandbox import SandboxServer
    from conductor_pipeline.workflow import OrchestrationConfig, PromptConfig
    from conductor_pipeline.workflow.policy import ScriptedPolicy

    class Warming(ScriptedPolicy):
        warmed = 0

        def warm_up(self, conversations):  # noqa: ANN001, ANN201
            self.warmed += 1
            return 0

    with SandboxServer(
        tasks_paths=bench_tasks(tmp_path), latency_scale=0.0, load_real_model=False
    ) as sandbox:
        pool = WorkerPool.from_config({"workers": sandbox.pool_config()})
        orchestration = OrchestrationConfig(prompt=PromptConfig(assistant_prefill="model_id = ["))
        figures = {}
        for warm_up in (False, True):
            policy = Warming(worker=pool.names.index("sim-abacus"))
            figures[warm_up] = serve_one_user(
                policy, pool, orchestration, ServedModel(), warm_up=warm_up, requests=3
            )
            assert policy.warmed == int(warm_up)
        asyncio.run(pool.aclose())
    for result in figures.values():
        assert result["status_counts"] == {"200": 4}
        assert 0 < result["warm_p50_s"] <= result["warm_p95_s"]
        assert result["first_request_s"] > 0 and result["ready_s"] > 0
        assert set(result["warm_breakdown_mean_s"]) == {"conductor_s", "workers_s", "other_s"}


def test_sft_benchmark_times_both_passes_on_a_tiny_model(tiny_model_dir, tmp_path):
    """The `sft` suite's measurement on the tiny random Llama with LoRA on its last layer:
    both passes run, and the recorded pass starts above the one frozen layer."""
    from conductor_pipeline.benchmarks.training import sft_step_benchmark
    from conductor_pipeline.training.configs import TrainingConfig
    from conductor_pipeline.workflow import PromptConfig

    config = TrainingConfig.from_params(
        {
            "base_model": str(tiny_model_dir),
            "output_dir": str(tmp_path),
            "lora": {"r": 4, "alpha": 8, "last_layers": 1},
        }
    )
    figures = sft_step_benchmark(
        config,
        PromptConfig(question_to_workers=True, few_shot=[]),
        [f"worker {i}" for i in range(6)],
        repeats=1,
    )
    assert figures["frozen_layers"] == 1 and figures["recorded_examples"] == figures["rows"] == 4
    assert figures["whole_model_s"] > 0 and figures["from_recorded_states_s"] > 0
