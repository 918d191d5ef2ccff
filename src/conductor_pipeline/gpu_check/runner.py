"""The check itself: one section at a time, then the verdict and the exit code."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from conductor_pipeline.gpu_check.environment import (
    DeviceMemorySampler,
    describe_environment,
    peak_memory,
)
from conductor_pipeline.gpu_check.generation import measure_generation
from conductor_pipeline.gpu_check.grpo import run_self_contained_grpo, run_trl_grpo
from conductor_pipeline.gpu_check.model import (
    KNOWN_ARCHITECTURES,
    ModelSource,
    ModelUnavailable,
    count_parameters,
    load_policy,
    load_tokenizer,
    materialise_model,
    prompt_token_ids,
    resolve_model_source,
)
from conductor_pipeline.gpu_check.options import Parts, choose_parts, parse_args, run_shape
from conductor_pipeline.gpu_check.profile import ProfileShapes, RunShape, load_profile
from conductor_pipeline.gpu_check.report import (
    EXIT_DOES_NOT_FIT,
    EXIT_FAILED,
    EXIT_INCOMPLETE,
    EXIT_NO_CUDA,
    EXIT_OK,
    STATUS,
    Budget,
    Report,
)
from conductor_pipeline.gpu_check.verdict import (
    OUT_OF_SCOPE,
    memory_verdict,
    step_problems,
    time_verdict,
)

ARCHITECTURE_KEYS = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")


def run_section(
    report: Report,
    name: str,
    device: str,
    action: Callable[[], dict[str, Any]],
    sampler: DeviceMemorySampler | None = None,
) -> bool:
    """Run one measurement; its result or its error goes under ``name``. True when it ran."""
    section: dict[str, Any] = {}
    report.data[name] = section
    print(f"gpu-check: {name} ...", file=sys.stderr, flush=True)
    try:
        with peak_memory(device, section, sampler):
            section.update(action())
        section.setdefault("status", "ok")
        return True
    except Exception as error:  # noqa: BLE001 - recorded, and the check fails
        section["status"] = "error"
        section["error"] = f"{type(error).__name__}: {error}"
        # the whole traceback on stderr; the one-page JSON keeps the innermost frame
        traceback.print_exc(file=sys.stderr)
        frame = traceback.extract_tb(error.__traceback__)[-1]
        section["where"] = f"{frame.filename}:{frame.lineno} in {frame.name}"
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


def _same_model(folder_config: dict[str, Any], source: ModelSource, base_model: str) -> bool:
    """Whether the measured model has the profile's base model's architecture."""
    if source.name == base_model:
        return True
    reference = KNOWN_ARCHITECTURES.get(base_model)
    return reference is not None and all(
        folder_config.get(k) == reference.get(k) for k in ARCHITECTURE_KEYS
    )


def _grpo_action(
    folder: Path,
    tokenizer: Any,
    ids: list[list[int]],
    shape: RunShape,
    parts: Parts,
    args: argparse.Namespace,
    context: dict[str, Any],
) -> Callable[[], dict[str, Any]]:
    """The GRPO section: TRL's trainer (with colocated vLLM when ``shape.use_vllm``), or
    the self-contained step on a policy loaded here."""
    budget, sampler = context["budget"], context["sampler"]
    if parts.trl:
        texts = [tokenizer.decode(row) for row in ids]
        return lambda: run_trl_grpo(
            folder, tokenizer, texts, shape, args.device, context["workdir"], budget, sampler.sample
        )

    def self_contained() -> dict[str, Any]:
        policy = (
            context.get("policy")
            or load_policy(folder, args.device, context["dtype"], shape.lora)[1]
        )
        context.pop("policy", None)
        return run_self_contained_grpo(
            policy, ids, shape, context["special_ids"], args.device, budget, sampler.sample
        )

    return self_contained


def _coverage(shape: RunShape, parts: Parts, grpo: dict[str, Any]) -> dict[str, Any]:
    lora = shape.lora
    checked = [
        f"GRPO steps: {grpo.get('impl', 'did not run')}",
        f"{shape.prompts} x {shape.group} completions a step, micro-batch {shape.micro_batch}, "
        f"{shape.prompt_tokens}-token prompts, {shape.completion_tokens}-token completions",
        f"LoRA r {lora.r}, alpha {lora.alpha}, dropout {lora.dropout} on "
        f"{len(lora.targets)} modules; bf16 and gradient checkpointing on CUDA",
        "loss and grad_norm finite at every timed step",
    ]
    if shape.use_vllm:
        checked.append(
            f"colocated vLLM generation at {shape.vllm_gpu_memory_utilization} of the GPU"
        )
    not_checked = [f"{name} (required): {why}" for name, why in parts.skipped.items()]
    not_checked += [f"{name} (by choice): {why}" for name, why in parts.optional.items()]
    not_checked.append(OUT_OF_SCOPE)
    return {"checked": checked, "not_checked": not_checked}


def _verdict(
    report: Report,
    shape: RunShape,
    profile: ProfileShapes,
    parts: Parts,
    same_model: bool,
    headroom: float,
) -> dict[str, Any]:
    grpo = report.data.get("grpo", {})
    total = report.data["environment"].get("gpu_total_gib")
    verdict: dict[str, Any] = {}
    verdict.update(
        memory_verdict(
            grpo.get("peak_device_gib"),
            total,
            shape,
            profile,
            same_model,
            headroom,
            loss_phase_peak_gib=grpo.get("phase_peaks_gib", {}).get("loss"),
        )
    )
    verdict.update(time_verdict(grpo.get("median_step_s"), shape, profile, same_model))
    verdict.update(_coverage(shape, parts, grpo))
    return verdict


def check(args: argparse.Namespace, report: Report, budget: Budget) -> tuple[int, str]:
    """Run every section; ``(exit code, message)``."""
    device = args.device
    report.data["environment"] = describe_environment(device)
    unusable = _unusable_device(device)
    if unusable is not None:
        return unusable
    profile = load_profile(args.conf)
    dtype = "bfloat16" if device == "cuda" else "float32"
    model_name = args.model or profile.base_model
    try:
        source = resolve_model_source(model_name, args.tokenizer, args.random_init)
    except ModelUnavailable as error:
        report.data["verdict"] = {"not_checked": [f"model: {error}", OUT_OF_SCOPE]}
        return EXIT_INCOMPLETE, str(error)
    sampler = DeviceMemorySampler(device)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        workdir = Path(tmp)
        folder = materialise_model(source, workdir, device, dtype)
        tokenizer = load_tokenizer(folder) or load_tokenizer(source.tokenizer_folder)
        parts = choose_parts(args, profile, has_tokenizer=tokenizer is not None)
        shape = run_shape(args, profile, use_vllm=parts.vllm)
        folder_config = json.loads((folder / "config.json").read_text())
        same_model = _same_model(folder_config, source, profile.base_model)
        report.data["profile"] = {
            "base_model": profile.base_model,
            "rows_per_step": profile.rows_per_step,
        }
        report.data["run"] = {
            "model": model_name,
            "source": source.kind,
            "note": source.note,
            "same_architecture_as_profile": same_model,
            "tokenizer": tokenizer is not None,
            "dtype": dtype,
            **{k: v for k, v in vars(shape).items() if k != "lora"},
        }
        eos = tokenizer.eos_token_id if tokenizer is not None else folder_config.get("eos_token_id")
        eos = eos[0] if isinstance(eos, list) else eos
        pad = tokenizer.pad_token_id if tokenizer is not None else eos
        vocab = int(folder_config["vocab_size"])
        ids = prompt_token_ids(tokenizer, shape.prompts, shape.prompt_tokens, vocab)
        context: dict[str, Any] = {
            "budget": budget,
            "sampler": sampler,
            "workdir": workdir,
            "dtype": dtype,
            "special_ids": (eos, pad),
        }
        ok = True
        if args.generation:
            context["policy"] = load_policy(folder, device, dtype, shape.lora)[1]
            report.data["run"].update(count_parameters(context["policy"]))
            ok &= run_section(
                report,
                "generation",
                device,
                lambda: measure_generation(
                    context["policy"], ids, shape.group, shape.completion_tokens, pad, device
                ),
            )
            if parts.trl:  # TRL loads its own copy
                context.pop("policy")
        action = _grpo_action(folder, tokenizer, ids, shape, parts, args, context)
        ok &= run_section(report, "grpo", device, action, sampler)
    problems = step_problems(report.data["grpo"]) if report.data["grpo"]["status"] == "ok" else []
    if problems:
        report.data["grpo"].update(status="error", error="; ".join(problems))
        ok = False
    verdict = _verdict(report, shape, profile, parts, same_model, args.headroom)
    report.data["verdict"] = verdict
    if not ok:
        return EXIT_FAILED, "the GRPO check failed; see the 'error' fields"
    if parts.skipped:
        named = "; ".join(f"{k}: {v}" for k, v in parts.skipped.items())
        return EXIT_INCOMPLETE, f"required parts were skipped ({named})"
    if verdict.get("fits_memory") is False:
        return EXIT_DOES_NOT_FIT, (
            f"the profile's run would not fit: about {verdict['estimated_peak_gib']} GiB at "
            f"peak against {verdict['limit_gib']} GiB usable"
        )
    suffix = "" if device == "cuda" else " (CPU dry run for tests: figures say nothing about a GPU)"
    return EXIT_OK, "every required part ran" + suffix


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
        traceback.print_exc(file=sys.stderr)
        code, message = EXIT_FAILED, f"{type(error).__name__}: {error}"
    finally:
        budget.cancel()
    status = STATUS[code]
    report.finish(status, message)
    stream = sys.stdout if code == EXIT_OK else sys.stderr
    print(f"gpu-check: {status}: {message}\ngpu-check: wrote {args.output}", file=stream)
    return code
