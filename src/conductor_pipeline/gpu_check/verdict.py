"""From the measured sections to the JSON's top-level answer: did the steps compute finite
numbers, would the profile's run fit the GPU's memory, and how long would it take."""

from __future__ import annotations

import math
from typing import Any

from conductor_pipeline.gpu_check.profile import ProfileShapes, RunShape

DEFAULT_HEADROOM = 0.05  # of the device's memory, for fragmentation and the allocator's slack

OUT_OF_SCOPE = (
    "the worker pool and its API keys, the datasets, several processes (NCCL) and the real "
    "reward (each rollout's workflow run on the workers): `conductor preflight` checks those"
)


def step_problems(section: dict[str, Any]) -> list[str]:
    """Why a GRPO section's numbers cannot be trusted: no timed step, or a loss or gradient
    norm that is missing or not finite."""
    problems = []
    if not section.get("steps_timed"):
        problems.append("no timed step ran (the budget ran out after the warm-up?)")
    for key in ("loss", "grad_norm"):
        values = section.get(key) or []
        if section.get("steps_timed") and len(values) < section["steps_timed"]:
            problems.append(f"{key} missing for some timed steps: {values}")
        bad = [v for v in values if v is None or not math.isfinite(float(v))]
        if bad:
            problems.append(f"{key} not finite: {values}")
    return problems


def memory_verdict(
    peak_device_gib: float | None,
    total_gib: float | None,
    shape: RunShape,
    profile: ProfileShapes,
    same_model: bool,
    headroom: float = DEFAULT_HEADROOM,
    loss_phase_peak_gib: float | None = None,
) -> dict[str, Any]:
    """``fits_memory``: the peak device memory of the measured steps (plus colocated vLLM's
    share when the measured steps ran without it) within the device's memory less
    ``headroom``. ``None`` with ``fits_memory_reason`` when the measurement cannot say.

    ``loss_phase_peak_gib``: the steps' peak after generation, when measured apart. Without
    vLLM, transformers' generate keeps the rollouts' KV cache in PyTorch's pool, which
    colocated vLLM keeps in its own share: then that peak plus the share is the estimate,
    not the whole peak plus the share, which would count the cache twice."""
    out: dict[str, Any] = {"fits_memory": None, "peak_device_gib": peak_device_gib}
    if peak_device_gib is None or total_gib is None:
        out["fits_memory_reason"] = "no GPU memory measured"
        return out
    scaled = shape.scaled_down(profile)
    if scaled or not same_model:
        why = f"scaled down ({', '.join(scaled)})" if scaled else "not the profile's model"
        out["fits_memory_reason"] = f"measured at other shapes than the profile's: {why}"
        return out
    estimate = peak_device_gib
    if profile.use_vllm and profile.vllm_mode == "colocate" and not shape.use_vllm:
        share = profile.vllm_gpu_memory_utilization * total_gib
        out["vllm_share_gib"] = round(share, 2)
        if loss_phase_peak_gib is None:
            estimate += share
            out["note"] = "measured without vLLM; its colocated share added"
        else:
            out["loss_phase_peak_gib"] = loss_phase_peak_gib
            estimate = loss_phase_peak_gib + share
            out["note"] = (
                "measured without vLLM: the peak after generation plus vLLM's colocated share "
                "(transformers' generation cache, which vLLM holds in its share, left out)"
            )
    limit = total_gib * (1.0 - headroom)
    out.update(
        estimated_peak_gib=round(estimate, 2),
        limit_gib=round(limit, 2),
        fits_memory=estimate <= limit,
    )
    return out


def time_verdict(
    median_step_s: float | None, shape: RunShape, profile: ProfileShapes, same_model: bool
) -> dict[str, Any]:
    """The measured step time and, at the profile's shapes, the projection to its
    ``prompts_per_step * num_generations`` completions per step and ``max_steps`` steps."""
    out: dict[str, Any] = {"step_s": median_step_s, "rows_measured": shape.rows_per_step}
    if median_step_s is None:
        return out
    if shape.scaled_down(profile) or not same_model:
        out["projection"] = "none: measured at other shapes than the profile's"
        return out
    factor = profile.rows_per_step / shape.rows_per_step
    step = median_step_s * factor
    out.update(
        rows_per_profile_step=profile.rows_per_step,
        projected_step_s=round(step, 1),
        max_steps=profile.max_steps,
        projected_run_h=round(step * profile.max_steps / 3600, 2),
        projection=(
            f"step time x{factor:g} (linear in completions per step; batched generation "
            "grows less, and every completion ran to full length: an upper bound for the "
            "policy's share). The real reward's worker calls are not included"
        ),
    )
    if profile.use_vllm and not shape.use_vllm:
        out["projection"] += "; measured with transformers' generate, not vLLM"
    return out
