"""``make gpu-check`` (``conductor_pipeline.gpu_check``): what can be checked without a GPU.

The CUDA figures themselves need a GPU; here: the no-CUDA answer is a clear failure with a
JSON saying so, the watchdog ends an over-budget run with a JSON saying so, and every
measurement (TRL's and the self-contained GRPO step, generation throughput) runs on the CPU
on a tiny model through the same code the GPU run takes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conductor_pipeline import gpu_check

SRC = Path(gpu_check.__file__).resolve().parents[2]
TINY_CONFIG = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
    "vocab_size": 300,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}
SMALL_RUN = [
    "--device", "cpu", "--steps", "1", "--prompts", "2", "--group", "2",
    "--prompt-tokens", "16", "--max-new-tokens", "4", "--lora-r", "2",
]  # fmt: skip


def _run_module(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(SRC), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "conductor_pipeline.gpu_check", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_without_cuda_it_fails_clearly_and_still_writes_the_json(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    done = _run_module(["--output", str(out)], tmp_path)
    assert done.returncode == gpu_check.EXIT_NO_CUDA
    assert "no CUDA device" in done.stderr
    report = json.loads(out.read_text())
    assert report["status"] == "no-cuda"
    assert "nothing was measured" in report["message"]
    assert report["environment"]["cuda_available"] is False
    assert "grpo" not in report  # no figure pretends to come from a GPU


def test_the_watchdog_ends_an_over_budget_run_with_a_timeout_json(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    # the budget runs out while torch and the model load
    done = _run_module(["--output", str(out), "--budget-s", "0.3", *SMALL_RUN], tmp_path)
    assert done.returncode == gpu_check.EXIT_TIMEOUT, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["status"] == "timeout"
    assert "budget" in report["message"]


def test_cpu_dry_run_through_trl(tiny_model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("trl")
    out = tmp_path / "gpu_check.json"
    code = gpu_check.main(["--output", str(out), "--model", str(tiny_model_dir), *SMALL_RUN])
    report = json.loads(out.read_text())
    assert code == gpu_check.EXIT_OK, report
    assert report["status"] == "ok" and "CPU dry run" in report["message"]
    assert report["grpo"]["impl"].startswith("trl:")
    assert report["grpo"]["steps_timed"] == 1 and report["grpo"]["median_step_s"] > 0
    assert report["generation"]["tokens_per_s"] > 0
    assert report["generation"]["new_tokens_per_row"] == 4
    assert report["vllm_colocate"]["status"].startswith("skipped")
    assert report["model"]["trainable_parameters"] > 0


def test_cpu_dry_run_on_a_bare_image_uses_the_self_contained_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without TRL, datasets, gguf, litellm or vLLM, and without weights: random weights
    of the configured architecture and the self-contained GRPO step still run."""
    for name in ("trl", "datasets", "gguf", "litellm", "vllm", "kedro", "mlflow"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails, find_spec is None
    monkeypatch.setattr(gpu_check.runner, "SMOLLM2_135M_CONFIG", TINY_CONFIG)
    monkeypatch.setenv("CONDUCTOR_MODEL_CACHE", str(tmp_path / "no-cache"))
    out = tmp_path / "gpu_check.json"
    code = gpu_check.main(["--output", str(out), *SMALL_RUN, "--steps", "2"])
    report = json.loads(out.read_text())
    assert code == gpu_check.EXIT_OK, report
    assert report["model"]["source"] == "random-init"
    assert report["model"]["tokenizer"] is False
    assert report["importable"] == {"trl": False, "vllm": False}
    assert report["grpo_path_reason"] == "TRL (or datasets) not importable"
    grpo = report["grpo"]
    assert grpo["impl"].startswith("self-contained")
    assert grpo["steps_timed"] == 2
    assert all(math.isfinite(x) for x in grpo["loss"])
    assert any(g > 0 for g in grpo["grad_norm"])  # the LoRA weights received a gradient
    assert report["vllm_colocate"]["status"] == "skipped: vllm not importable"


def test_a_failing_section_fails_the_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(gpu_check.runner, "SMOLLM2_135M_CONFIG", TINY_CONFIG)
    monkeypatch.setenv("CONDUCTOR_MODEL_CACHE", str(tmp_path / "no-cache"))
    monkeypatch.setitem(sys.modules, "gguf", None)

    def broken(*args: object, **kwargs: object) -> dict[str, object]:
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(gpu_check.runner, "measure_generation", broken)
    out = tmp_path / "gpu_check.json"
    code = gpu_check.main(["--output", str(out), *SMALL_RUN, "--no-trl"])
    report = json.loads(out.read_text())
    assert code == gpu_check.EXIT_FAILED
    assert report["status"] == "failed"
    assert report["generation"]["status"] == "error"
    assert "simulated kernel failure" in report["generation"]["error"]
    assert report["grpo"]["status"] == "ok"  # the other sections still ran


def test_completion_mask_keeps_tokens_up_to_the_first_eos() -> None:
    import torch

    completions = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8]])
    mask = gpu_check.completion_mask(completions, eos_token_id=2)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    rewards = gpu_check.synthetic_rewards(completions, mask)
    assert rewards.tolist() == pytest.approx([7 / 96, 26 / 96])


def test_a_watchdog_firing_after_the_verdict_leaves_it_alone(tmp_path: Path) -> None:
    report = gpu_check.Report(tmp_path / "gpu_check.json", [], budget_s=1.0)
    assert report.finish("ok", "all sections ran") is True
    gpu_check.Budget(report, 1.0)._expire()  # would os._exit(3) if it overrode the verdict
    assert json.loads(report.path.read_text())["status"] == "ok"
    assert report.finish("failed", "late") is False
