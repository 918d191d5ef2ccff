"""The check itself: arguments, one section at a time, the verdict and the exit code."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conductor_pipeline.gpu_check.environment import (
    describe_environment,
    module_version,
    peak_memory,
)
from conductor_pipeline.gpu_check.generation import measure_generation, measure_vllm_generation
from conductor_pipeline.gpu_check.grpo import run_self_contained_grpo, run_trl_grpo
from conductor_pipeline.gpu_check.model import (
    LORA_TARGETS,
    SMOLLM2_135M_CONFIG,
    count_parameters,
    load_policy,
    load_tokenizer,
    materialise_model,
    prompt_token_ids,
    resolve_model_source,
)
from conductor_pipeline.gpu_check.report import (
    DEFAULT_BUDGET_S,
    DEFAULT_OUTPUT,
    EXIT_FAILED,
    EXIT_NO_CUDA,
    EXIT_OK,
    Budget,
    Report,
)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m conductor_pipeline.gpu_check",
        description="Short GPU check: bf16 GRPO steps with LoRA, generation throughput, peak "
        "GPU memory, vLLM colocate if importable. Writes " + str(DEFAULT_OUTPUT) + ".",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu only for the unit tests (its figures say nothing about GPUs)",
    )
    parser.add_argument("--steps", type=int, default=4, help="timed GRPO steps (after a warm-up)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--lora-r", type=int, default=64)
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="a transformers folder (default: the project's SmolLM2 copy)",
    )
    parser.add_argument(
        "--tokenizer", type=Path, default=None, help="tokenizer folder for random-weight runs"
    )
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S)
    parser.add_argument("--no-trl", action="store_true", help="use the self-contained GRPO step")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM section")
    parser.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3)
    return parser.parse_args(list(argv))


def run_section(
    report: Report, name: str, device: str, action: Callable[[], dict[str, Any]]
) -> bool:
    """Run one measurement; its result or its error goes under ``name``. True when it ran."""

    section: dict[str, Any] = {}
    report.data[name] = section
    print(f"gpu-check: {name} ...", file=sys.stderr, flush=True)
    try:
        with peak_memory(device, section):
            section.update(action())
        section.setdefault("status", "ok")
        return True
    except Exception as error:  # noqa: BLE001 - recorded, and the check fails
        section["status"] = "error"
        section["error"] = f"{type(error).__name__}: {error}"
        section["traceback"] = traceback.format_exc(limit=8)
        print(f"gpu-check: {name} failed: {section['error']}", file=sys.stderr, flush=True)
        return False


def _unusable_device(device: str) -> tuple[int, str] | None:
    """Why nothing can be measured on ``device``, or ``None`` when it can."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        return EXIT_NO_CUDA, (
            f"no CUDA device: torch {torch.__version__} (CUDA build: {torch.version.cuda}) sees "
            "none, so nothing was measured. Run `make gpu-check` on a machine with an NVIDIA "
            "GPU and a CUDA build of PyTorch."
        )
    if device == "cuda" and not torch.cuda.is_bf16_supported():
        return EXIT_FAILED, "this GPU does not support bf16, which the GPU profile trains in"
    return None


def _record_setup(args: argparse.Namespace, report: Report, dtype: str) -> tuple[bool, bool]:
    """Record what is importable and the run's shape; ``(TRL usable, vLLM importable)``."""
    trl_ok = (
        not args.no_trl
        and module_version("trl") is not None
        and module_version("datasets") is not None
    )
    vllm_ok = module_version("vllm") is not None
    report.data["importable"] = {"trl": module_version("trl") is not None, "vllm": vllm_ok}
    report.data["config"] = {
        "device": args.device,
        "dtype": dtype,
        "prompts": args.prompts,
        "group": args.group,
        "prompt_tokens": args.prompt_tokens,
        "max_new_tokens": args.max_new_tokens,
        "steps": args.steps,
        "lora": {"r": args.lora_r, "alpha": 2 * args.lora_r, "target_modules": LORA_TARGETS},
    }
    return trl_ok, vllm_ok


@dataclass
class _Setup:
    """What every section measures on: the model folder, its tokenizer and the prompts."""

    args: argparse.Namespace
    folder: Path
    workdir: Path
    tokenizer: Any | None
    ids: list[list[int]]
    texts: list[str]
    eos: int | None
    pad: int | None
    budget: Budget

    def trl_grpo(self, steps: int, **options: Any) -> dict[str, Any]:
        args = self.args
        return run_trl_grpo(
            self.folder,
            self.tokenizer,
            self.texts,
            args.group,
            args.max_new_tokens,
            steps,
            args.device,
            args.lora_r,
            self.workdir,
            budget=self.budget,
            **options,
        )


def _grpo_action(
    setup: _Setup, trl_ok: bool, report: Report, loaded: dict[str, Any]
) -> Callable[[], dict[str, Any]]:
    """The GRPO section: through TRL when it can run, else the self-contained step on the
    already loaded policy (``loaded``; emptied when TRL loads its own copy instead)."""
    import torch

    args = setup.args
    if trl_ok and setup.tokenizer is not None:
        # TRL loads its own copy of the model; the measuring copy would only hold memory
        loaded.clear()
        if args.device == "cuda":
            torch.cuda.empty_cache()
        return lambda: setup.trl_grpo(args.steps)
    if args.no_trl:
        why = "--no-trl"
    else:
        why = "TRL (or datasets) not importable" if not trl_ok else "no tokenizer for TRL"
    report.data["grpo_path_reason"] = why
    policy = loaded["policy"]
    return lambda: run_self_contained_grpo(
        policy,
        setup.ids,
        args.group,
        args.max_new_tokens,
        args.steps,
        (setup.eos, setup.pad),
        args.device,
        setup.budget,
    )


def _vllm_section(setup: _Setup, trl_ok: bool, vllm_ok: bool, report: Report) -> bool:
    """TRL's colocated vLLM generation, or plain vLLM sampling without TRL; a reason
    recorded instead when it cannot or should not run. False when it failed."""
    args, budget = setup.args, setup.budget
    skipped = None
    if args.no_vllm:
        skipped = "skipped: --no-vllm"
    elif not vllm_ok:
        skipped = "skipped: vllm not importable"
    elif args.device != "cuda":
        skipped = "skipped: vllm needs CUDA"
    elif budget.remaining() < 150:
        skipped = f"skipped: {budget.remaining():.0f} s of budget left (needs ~150 s)"
    if skipped is not None:
        report.data["vllm_colocate"] = {"status": skipped}
        return True
    if trl_ok and setup.tokenizer is not None:
        action = lambda: setup.trl_grpo(  # noqa: E731
            max(1, min(args.steps, 2)),
            use_vllm=True,
            vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        )
    else:
        action = lambda: measure_vllm_generation(  # noqa: E731
            setup.folder,
            setup.ids,
            args.group,
            args.max_new_tokens,
            args.vllm_gpu_memory_utilization,
        )
    return run_section(report, "vllm_colocate", args.device, action)


def _record_peak_memory(report: Report) -> None:
    report.data["memory"] = {
        "peak_allocated_gib": max(
            (s.get("peak_allocated_gib", 0.0) for s in report.data.values() if isinstance(s, dict)),
            default=0.0,
        ),
        "total_gib": report.data["environment"].get("gpu_total_gib"),
        "note": "torch.cuda.max_memory_allocated per section (reset before each); vLLM's "
        "own pool is reserved outside PyTorch's allocator counters",
    }


def check(args: argparse.Namespace, report: Report, budget: Budget) -> tuple[int, str]:
    """Run every section; ``(exit code, message)``."""
    device = args.device
    report.data["environment"] = describe_environment(device)
    unusable = _unusable_device(device)
    if unusable is not None:
        return unusable
    dtype = "bfloat16" if device == "cuda" else "float32"
    trl_ok, vllm_ok = _record_setup(args, report, dtype)
    source = resolve_model_source(args.model, args.tokenizer)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        workdir = Path(tmp)
        folder = materialise_model(source, workdir, SMOLLM2_135M_CONFIG)
        tokenizer = load_tokenizer(folder) or load_tokenizer(source.tokenizer_folder)
        base, policy = load_policy(folder, device, dtype, args.lora_r)
        eos = tokenizer.eos_token_id if tokenizer is not None else base.config.eos_token_id
        pad = tokenizer.pad_token_id if tokenizer is not None else eos
        report.data["model"] = {
            "source": source.kind,
            "note": source.note,
            "tokenizer": tokenizer is not None,
            **count_parameters(policy),
        }
        vocab = int(base.config.vocab_size)
        ids = prompt_token_ids(tokenizer, args.prompts, args.prompt_tokens, vocab)
        texts = [tokenizer.decode(row) for row in ids] if tokenizer is not None else []
        setup = _Setup(args, folder, workdir, tokenizer, ids, texts, eos, pad, budget)
        loaded = {"policy": policy}
        del base, policy  # from here on only ``loaded`` holds them (see _grpo_action)
        ok = run_section(
            report,
            "generation",
            device,
            lambda: measure_generation(
                loaded["policy"], ids, args.group, args.max_new_tokens, pad, device
            ),
        )
        ok &= run_section(report, "grpo", device, _grpo_action(setup, trl_ok, report, loaded))
        ok &= _vllm_section(setup, trl_ok, vllm_ok, report)
    if device == "cuda":
        _record_peak_memory(report)
    if not ok:
        return EXIT_FAILED, "one or more sections failed; see their 'error' fields"
    suffix = "" if device == "cuda" else " (CPU dry run for tests: figures say nothing about a GPU)"
    return EXIT_OK, "all sections ran" + suffix


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``make gpu-check``; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the check never downloads anything
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report = Report(args.output, argv, args.budget_s)
    budget = Budget(report, args.budget_s)
    budget.start()
    try:
        code, message = check(args, report, budget)
    except Exception as error:  # noqa: BLE001 - anything unexpected still leaves a JSON
        code, message = EXIT_FAILED, f"{type(error).__name__}: {error}"
    finally:
        budget.cancel()
    status = {EXIT_OK: "ok", EXIT_NO_CUDA: "no-cuda"}.get(code, "failed")
    report.finish(status, message)
    stream = sys.stdout if code == EXIT_OK else sys.stderr
    print(f"gpu-check: {status}: {message}\ngpu-check: wrote {args.output}", file=stream)
    return code
