"""The check's arguments, the shapes they select (the GPU profile's unless scaled down), and
which of the profile's parts a run can exercise here."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from conductor_pipeline.gpu_check.environment import module_version
from conductor_pipeline.gpu_check.profile import LoraShape, ProfileShapes, RunShape
from conductor_pipeline.gpu_check.report import DEFAULT_BUDGET_S, DEFAULT_OUTPUT
from conductor_pipeline.gpu_check.verdict import DEFAULT_HEADROOM


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m conductor_pipeline.gpu_check",
        description="GRPO steps at the GPU profile's shapes (its base model, prompt and "
        "completion lengths, group, micro-batch, LoRA, bf16, gradient checkpointing, "
        "colocated vLLM): whether a run fits the GPU's memory and how long a step takes. "
        "Every size defaults to the profile's (conf/gpu/parameters_training.yml). Writes "
        + str(DEFAULT_OUTPUT)
        + ".",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--conf", type=Path, default=None, help="the conf/ folder to read")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu only for the unit tests (its figures say nothing about GPUs)",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="a folder or a Hugging Face id in the local cache (default: the profile's "
        "training.base_model); a smaller model measures another run than the profile's",
    )
    parser.add_argument(
        "--random-init",
        action="store_true",
        help="the model's architecture with random weights, when its weights are absent",
    )
    parser.add_argument("--tokenizer", type=Path, default=None, help="tokenizer folder")
    parser.add_argument("--steps", type=int, default=2, help="timed steps (after a warm-up)")
    parser.add_argument(
        "--prompts",
        type=int,
        default=1,
        help="questions per measured step (default 1; the step time is projected to the "
        "profile's prompts_per_step)",
    )
    parser.add_argument("--group", type=int, default=None, help="completions per prompt")
    parser.add_argument("--micro-batch", type=int, default=None, help="rows per backward pass")
    parser.add_argument("--prompt-tokens", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--lora-r", type=int, default=None)
    parser.add_argument(
        "--headroom",
        type=float,
        default=DEFAULT_HEADROOM,
        help="share of the GPU's memory kept free in the fits_memory verdict",
    )
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S)
    parser.add_argument(
        "--no-trl", action="store_true", help="the self-contained GRPO step, by choice"
    )
    parser.add_argument(
        "--no-vllm", action="store_true", help="generate with transformers, by choice"
    )
    parser.add_argument("--vllm-gpu-memory-utilization", type=float, default=None)
    parser.add_argument(
        "--generation", action="store_true", help="also time transformers' generate alone"
    )
    return parser.parse_args(list(argv))


def run_shape(args: argparse.Namespace, profile: ProfileShapes, use_vllm: bool) -> RunShape:
    """The shapes to measure: each option given, else the profile's."""
    group = args.group or profile.num_generations
    micro = args.micro_batch or profile.micro_batch_size
    rows = args.prompts * group
    if rows % micro:
        raise ValueError(
            f"--prompts x --group ({args.prompts} x {group}) must be divisible by the "
            f"micro-batch ({micro}), as training.grpo requires"
        )
    r = args.lora_r or profile.lora_r
    alpha = profile.lora_alpha * r // profile.lora_r  # the profile's alpha/r ratio
    return RunShape(
        prompts=args.prompts,
        group=group,
        micro_batch=micro,
        prompt_tokens=args.prompt_tokens or profile.max_prompt_tokens,
        completion_tokens=args.max_new_tokens or profile.max_completion_length,
        steps=args.steps,
        lora=LoraShape(r, alpha, profile.lora_dropout, tuple(profile.lora_targets)),
        gradient_checkpointing=profile.gradient_checkpointing,
        loss_type=profile.loss_type,
        use_vllm=use_vllm,
        vllm_gpu_memory_utilization=(
            args.vllm_gpu_memory_utilization or profile.vllm_gpu_memory_utilization
        ),
    )


@dataclass
class Parts:
    """Which of TRL and vLLM the run uses; ``skipped``: the required ones it cannot run,
    each with its reason (a non-zero exit); ``optional``: those left out by choice."""

    trl: bool
    vllm: bool
    skipped: dict[str, str] = field(default_factory=dict)
    optional: dict[str, str] = field(default_factory=dict)


def choose_parts(
    args: argparse.Namespace, profile: ProfileShapes, has_tokenizer: bool | None = None
) -> Parts:
    """TRL is required unless ``--no-trl``; vLLM is required when the profile generates
    with it, unless ``--no-vllm``. ``has_tokenizer``: ``False`` once it is known that there
    is none (TRL needs one)."""
    parts = Parts(trl=False, vllm=False)
    if args.no_trl:
        parts.optional["trl"] = "--no-trl"
    elif module_version("trl") is None or module_version("datasets") is None:
        parts.skipped["trl"] = "TRL (or datasets) not importable: `make gpu-wheels`"
    elif has_tokenizer is False:
        parts.skipped["trl"] = "no tokenizer for TRL's trainer: pass --tokenizer DIR"
    else:
        parts.trl = True
    if not profile.use_vllm:
        parts.optional["vllm"] = "the profile does not generate with vLLM"
    elif args.no_vllm:
        parts.optional["vllm"] = "--no-vllm"
    elif module_version("vllm") is None:
        parts.skipped["vllm"] = "vllm not importable"
    elif args.device != "cuda":
        parts.skipped["vllm"] = "vllm needs CUDA"
    elif not parts.trl:
        parts.skipped["vllm"] = "colocated vLLM runs inside TRL's trainer, which cannot run"
    else:
        parts.vllm = True
    return parts
