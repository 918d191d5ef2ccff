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
    results = json.loads(output.read_text())["results"]
    rewards = results["rewards"]
    assert rewards["rollouts"] == 64 and rewards["worker_calls_per_pass"] == 96
    assert rewards["cold_cache_rollouts_per_s"] > 0 and rewards["warm_cache_rollouts_per_s"] > 0
    assert results["executor"]["overhead_per_step_ms"] > 0


@pytest.mark.slow
def test_training_benchmark_runs_on_a_tiny_model(tiny_model_dir, tmp_path):
    """The `training` suite's measurement in a reduced mode (tiny random Llama, one
    measured step, groups of two): both trainers train, the project's fast paths serve
    every generation and scoring call, and the report has its figures."""
    import torch

    from conductor_pipeline.benchmarks.suites import training_step_benchmark
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
