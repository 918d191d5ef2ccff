"""``make gpu-check`` (``conductor_pipeline.gpu_check``): what can be checked without a GPU.

The CUDA figures themselves need a GPU; here: the shapes come from the GPU profile, the
profile's base model is the default and its absence fails, a required part that cannot run
(TRL, vLLM) fails, a non-finite loss or no timed step fails, the verdict's memory and time
arithmetic, the exit codes, and every measurement (TRL's trainer and the self-contained GRPO
step) on the CPU on a tiny model through the same code the GPU run takes.
"""

from __future__ import annotations

import dataclasses
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
    "--device", "cpu", "--steps", "1", "--prompts", "2", "--group", "2", "--micro-batch", "2",
    "--prompt-tokens", "16", "--max-new-tokens", "4", "--lora-r", "2",
]  # fmt: skip
PROFILE = gpu_check.load_profile()
ROOT = SRC.parent


@pytest.fixture
def empty_hf_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No model in the Hugging Face cache, whatever this machine holds."""
    import huggingface_hub.constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.fixture
def tiny_architecture(monkeypatch: pytest.MonkeyPatch, empty_hf_cache: Path) -> None:
    """--random-init of the profile's base model builds a tiny model instead of a 7B."""
    monkeypatch.setitem(gpu_check.KNOWN_ARCHITECTURES, PROFILE.base_model, TINY_CONFIG)


def _main(args: list[str], tmp_path: Path) -> tuple[int, dict]:
    out = tmp_path / "gpu_check.json"
    code = gpu_check.main(["--output", str(out), *args])
    return code, json.loads(out.read_text())


def _run_module(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        PYTHONPATH=str(SRC),
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
        HF_HUB_CACHE=str(tmp_path / "hf-cache"),
    )
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
    # the budget runs out while torch loads
    done = _run_module(["--output", str(out), "--budget-s", "0.3", *SMALL_RUN], tmp_path)
    assert done.returncode == gpu_check.EXIT_TIMEOUT, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["status"] == "timeout"
    assert "budget" in report["message"]


def test_the_profile_shapes_are_the_gpu_profiles() -> None:
    assert PROFILE.base_model == "Qwen/Qwen2.5-7B-Instruct"
    assert (PROFILE.max_prompt_tokens, PROFILE.max_completion_length) == (4096, 1024)
    assert (PROFILE.num_generations, PROFILE.prompts_per_step) == (64, 4)
    assert (PROFILE.micro_batch_size, PROFILE.max_steps) == (8, 200)
    assert (PROFILE.lora_r, PROFILE.lora_alpha, PROFILE.lora_dropout) == (64, 128, 0.0)
    assert len(PROFILE.lora_targets) == 7
    assert PROFILE.use_vllm and PROFILE.vllm_mode == "colocate"
    # with no option given, every per-row shape is the profile's: its memory verdict counts
    shape = gpu_check.run_shape(gpu_check.parse_args([]), PROFILE, use_vllm=True)
    assert shape.scaled_down(PROFILE) == []
    assert (shape.group, shape.micro_batch, shape.prompt_tokens) == (64, 8, 4096)
    assert shape.completion_tokens == 1024 and shape.lora.r == 64 and shape.lora.alpha == 128
    assert shape.vllm_gpu_memory_utilization == 0.3


def test_the_makefile_stops_the_check_only_after_its_own_budget() -> None:
    import re

    makefile = (ROOT / "Makefile").read_text()
    limit = int(
        re.search(
            r"timeout -k \d+ (\d+) \$\(GPU_PYTHON\) -m conductor_pipeline.gpu_check", makefile
        )[1]
    )
    assert limit > gpu_check.DEFAULT_BUDGET_S


def test_absent_weights_of_the_profiles_model_fail_and_say_so(
    empty_hf_cache: Path, tmp_path: Path
) -> None:
    code, report = _main([*SMALL_RUN], tmp_path)
    assert code == gpu_check.EXIT_INCOMPLETE
    assert report["status"] == "incomplete"
    assert "Qwen/Qwen2.5-7B-Instruct" in report["message"]
    assert "never downloads" in report["message"] and "--random-init" in report["message"]
    assert "grpo" not in report


def test_cpu_dry_run_through_trl(tiny_model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("trl")
    code, report = _main(["--model", str(tiny_model_dir), *SMALL_RUN, "--no-vllm"], tmp_path)
    assert code == gpu_check.EXIT_OK, report
    assert report["status"] == "ok" and "CPU dry run" in report["message"]
    assert report["grpo"]["impl"].startswith("trl:")
    assert report["grpo"]["steps_timed"] == 1 and report["grpo"]["median_step_s"] > 0
    # every completion ran to full length (the worst case the check measures)
    assert report["grpo"]["completion_length_mean"] == [4.0]
    verdict = report["verdict"]
    assert verdict["step_s"] == report["grpo"]["median_step_s"]
    assert verdict["fits_memory"] is None  # no GPU memory on the CPU
    assert any("vllm (by choice): --no-vllm" in line for line in verdict["not_checked"])
    assert any("preflight" in line for line in verdict["not_checked"])
    assert report["run"]["same_architecture_as_profile"] is False
    # one page: the verdict first, no tracebacks, lists on one line
    text = (tmp_path / "gpu_check.json").read_text()
    assert len(text.splitlines()) < 80
    assert list(report)[:3] == ["status", "message", "verdict"]


def test_vllm_not_importable_while_the_profile_uses_it_fails(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)
    code, report = _main(["--model", str(tiny_model_dir), *SMALL_RUN, "--no-trl"], tmp_path)
    assert code == gpu_check.EXIT_INCOMPLETE, report
    assert report["status"] == "incomplete"
    assert "vllm not importable" in report["message"]
    assert report["grpo"]["status"] == "ok"  # what could run still ran
    assert "vllm (required): vllm not importable" in report["verdict"]["not_checked"]


def test_a_bare_image_without_trl_fails_unless_told_to_do_without(
    monkeypatch: pytest.MonkeyPatch, tiny_architecture: None, tmp_path: Path
) -> None:
    """Without TRL, datasets, litellm or vLLM, and without weights: the profile's model
    built with random weights (--random-init) and the self-contained GRPO step run, and the
    check still fails because the required parts did not."""
    for name in ("trl", "datasets", "litellm", "vllm", "kedro", "mlflow"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails, find_spec is None
    code, report = _main([*SMALL_RUN, "--random-init", "--steps", "2"], tmp_path)
    assert code == gpu_check.EXIT_INCOMPLETE, report
    assert "trl: TRL (or datasets) not importable" in report["message"]
    assert "vllm: vllm not importable" in report["message"]
    assert report["run"]["source"] == "random-init"
    assert report["run"]["same_architecture_as_profile"] is True
    grpo = report["grpo"]
    assert grpo["impl"].startswith("self-contained") and grpo["steps_timed"] == 2
    assert all(math.isfinite(x) for x in grpo["loss"])
    assert any(g > 0 for g in grpo["grad_norm"])  # the LoRA weights received a gradient

    code, report = _main([*SMALL_RUN, "--random-init", "--no-trl", "--no-vllm"], tmp_path)
    assert code == gpu_check.EXIT_OK, report


def _fake_grpo(**result: object):
    def fake(*args: object, **kwargs: object) -> dict[str, object]:
        return {"impl": "fake", "median_step_s": 1.0, **result}

    return fake


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"steps_timed": 1, "loss": [float("nan")], "grad_norm": [0.5]}, "loss not finite"),
        ({"steps_timed": 1, "loss": [0.1], "grad_norm": [float("inf")]}, "grad_norm not finite"),
        ({"steps_timed": 1, "loss": [0.1], "grad_norm": [None]}, "grad_norm not finite"),
        ({"steps_timed": 0, "loss": [], "grad_norm": []}, "no timed step"),
    ],
)
def test_a_non_finite_step_or_no_timed_step_fails_the_check(
    result: dict,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    tiny_architecture: None,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(gpu_check.runner, "run_self_contained_grpo", _fake_grpo(**result))
    args = [*SMALL_RUN, "--random-init", "--no-trl", "--no-vllm"]
    code, report = _main(args, tmp_path)
    assert code == gpu_check.EXIT_FAILED, report
    assert report["grpo"]["status"] == "error"
    assert expected in report["grpo"]["error"]


def test_a_run_that_would_not_fit_exits_five(
    monkeypatch: pytest.MonkeyPatch, tiny_architecture: None, tmp_path: Path
) -> None:
    def no_fit(*args: object, **kwargs: object) -> dict[str, object]:
        return {"fits_memory": False, "estimated_peak_gib": 150.0, "limit_gib": 133.9}

    monkeypatch.setattr(gpu_check.runner, "memory_verdict", no_fit)
    code, report = _main([*SMALL_RUN, "--random-init", "--no-trl", "--no-vllm"], tmp_path)
    assert code == gpu_check.EXIT_DOES_NOT_FIT, report
    assert report["status"] == "does-not-fit" and "150.0 GiB" in report["message"]


def _profile_shape(**changes: object) -> gpu_check.RunShape:
    args = gpu_check.parse_args([])
    for key, value in changes.items():
        setattr(args, key, value)
    return gpu_check.run_shape(args, PROFILE, use_vllm=True)


def test_memory_verdict_counts_vllms_share_and_the_headroom() -> None:
    shape = _profile_shape()
    fits = gpu_check.memory_verdict(90.0, 140.0, shape, PROFILE, same_model=True)
    assert fits["fits_memory"] is True and fits["limit_gib"] == 133.0
    too_big = gpu_check.memory_verdict(135.0, 140.0, shape, PROFILE, same_model=True)
    assert too_big["fits_memory"] is False
    # measured without vLLM: its colocated share (0.3 of the GPU) is added
    without = dataclasses.replace(shape, use_vllm=False)
    added = gpu_check.memory_verdict(95.0, 140.0, without, PROFILE, same_model=True)
    assert added["vllm_share_gib"] == 42.0 and added["fits_memory"] is False
    # the peak after generation measured apart: transformers' generation cache, which vLLM
    # holds in its own share, is not counted twice (the H200 run of 2026-12-04 had a whole
    # peak of 104.7 GiB; with the share added it read as not fitting)
    apart = gpu_check.memory_verdict(
        104.7, 140.0, without, PROFILE, same_model=True, loss_phase_peak_gib=60.0
    )
    assert apart["estimated_peak_gib"] == 102.0 and apart["fits_memory"] is True
    assert apart["loss_phase_peak_gib"] == 60.0 and "generation" in apart["note"]
    # scaled-down shapes or another model cannot answer for the profile's run
    short = _profile_shape(prompt_tokens=512)
    unknown = gpu_check.memory_verdict(10.0, 140.0, short, PROFILE, same_model=True)
    assert unknown["fits_memory"] is None and "prompt_tokens" in unknown["fits_memory_reason"]
    other = gpu_check.memory_verdict(10.0, 140.0, shape, PROFILE, same_model=False)
    assert other["fits_memory"] is None


def test_time_verdict_projects_to_the_profiles_step_and_run() -> None:
    shape = _profile_shape()  # one question of 64 completions; the profile's step has four
    verdict = gpu_check.time_verdict(100.0, shape, PROFILE, same_model=True)
    assert verdict["projected_step_s"] == 400.0
    assert verdict["projected_run_h"] == pytest.approx(400 * 200 / 3600, abs=0.01)
    assert "upper bound" in verdict["projection"]
    scaled = gpu_check.time_verdict(100.0, _profile_shape(lora_r=8), PROFILE, same_model=True)
    assert "projected_step_s" not in scaled


def test_a_failing_section_fails_the_check(
    monkeypatch: pytest.MonkeyPatch, tiny_architecture: None, tmp_path: Path
) -> None:
    def broken(*args: object, **kwargs: object) -> dict[str, object]:
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(gpu_check.runner, "measure_generation", broken)
    args = [*SMALL_RUN, "--random-init", "--no-trl", "--no-vllm", "--generation"]
    code, report = _main(args, tmp_path)
    assert code == gpu_check.EXIT_FAILED
    assert report["status"] == "failed"
    assert report["generation"]["status"] == "error"
    assert "simulated kernel failure" in report["generation"]["error"]
    assert "traceback" not in report["generation"]  # on stderr; the JSON stays one page
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


def test_a_step_runs_when_one_more_fits_the_budget() -> None:
    from conductor_pipeline.gpu_check.grpo import room_for_another_step

    # the H200 run of 2026-12-04: a 157 s warm-up with 336 s left stopped before any timed
    # step under the old rule (room for two steps); one step and a margin is what is needed
    assert room_for_another_step(336.0, [157.0])
    assert not room_for_another_step(200.0, [157.0])
    assert not room_for_another_step(300.0, [100.0, 240.0])  # the slowest step decides


def test_the_qwen_tokenizer_folder_puts_the_special_tokens_after_the_vocabulary(
    tmp_path: Path,
) -> None:
    import base64

    from transformers import AutoTokenizer

    from conductor_pipeline.gpu_check.qwen_tokenizer import SPECIAL_TOKENS, build_qwen_tokenizer

    # a tiktoken file in Qwen's format: the 256 bytes, then one merge ("ab", rank 256)
    ranks = [bytes([b]) for b in range(256)] + [b"ab"]
    vocab = tmp_path / "tiny.tiktoken"
    vocab.write_text(
        "".join(f"{base64.b64encode(t).decode()} {rank}\n" for rank, t in enumerate(ranks))
    )
    size = build_qwen_tokenizer(vocab, tmp_path / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tokenizer")
    assert size == 257 + len(SPECIAL_TOKENS)
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"]) == [257, 259]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer("ab", add_special_tokens=False)["input_ids"] == [256]
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "ab"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"
