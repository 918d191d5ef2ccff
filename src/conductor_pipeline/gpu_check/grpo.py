"""GRPO steps to time: through TRL (the project's trainer or TRL's own), or a
self-contained step where TRL is not importable."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from conductor_pipeline.gpu_check.environment import GIB, device_used_gib, synchronize
from conductor_pipeline.gpu_check.model import lora_config
from conductor_pipeline.gpu_check.profile import RunShape
from conductor_pipeline.gpu_check.report import Budget


def synthetic_reward(token_ids: Sequence[int]) -> float:
    """A cheap reward in [0, 1] that differs between completions (a checksum of the token
    ids), so that group advantages and gradients are non-zero; what it rewards does not
    matter for timing."""
    return (sum(int(t) for t in token_ids) % 97) / 96


def synthetic_rewards(completions: Any, mask: Any) -> Any:
    """:func:`synthetic_reward` of each row's tokens up to its EOS."""
    import torch

    rewards = [
        synthetic_reward(row[keep.bool()].tolist())
        for row, keep in zip(completions, mask, strict=True)
    ]
    return torch.tensor(rewards, dtype=torch.float32)


def completion_mask(completions: Any, eos_token_id: int | None) -> Any:
    """1 for each generated token up to and including the first EOS, 0 after it."""
    import torch

    if eos_token_id is None:
        return torch.ones_like(completions)
    is_eos = completions == eos_token_id
    after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return (~after_eos).long()


def self_contained_grpo_step(
    policy: Any,
    optimizer: Any,
    prompts: Any,
    shape: RunShape,
    eos_token_id: int | None,
    pad_token_id: int | None,
    device: str,
) -> dict[str, float]:
    """One on-policy GRPO step without TRL: sample ``shape.group`` completions per prompt,
    each exactly ``shape.completion_tokens`` long (the worst case), standardise rewards
    within each group, and minimise the token-mean of ``-advantage * log p`` in
    micro-batches of ``shape.micro_batch`` rows with gradient accumulation. With one
    iteration per batch GRPO's clipped ratio is 1, so this is its gradient (no KL term, as
    in the GPU profile's ``beta: 0``)."""
    import torch

    started = time.perf_counter()
    rows = prompts.repeat_interleave(shape.group, dim=0)
    prompt_len = rows.shape[1]
    policy.eval()
    with torch.no_grad():
        out = policy.generate(
            input_ids=rows,
            attention_mask=torch.ones_like(rows),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=shape.completion_tokens,
            min_new_tokens=shape.completion_tokens,
            pad_token_id=pad_token_id if pad_token_id is not None else eos_token_id,
            eos_token_id=eos_token_id,
        )
    completions = out[:, prompt_len:]
    mask = completion_mask(completions, eos_token_id).to(out.device)
    synchronize(device)
    generated = time.perf_counter()

    rewards = synthetic_rewards(completions.cpu(), mask.cpu()).view(-1, shape.group)
    advantages = (rewards - rewards.mean(dim=1, keepdim=True)) / (
        rewards.std(dim=1, keepdim=True) + 1e-4
    )
    advantages = advantages.view(-1, 1).to(out.device)

    policy.train()
    n_new = completions.shape[1]
    total_tokens = mask.float().sum().clamp(min=1.0)
    loss_sum = 0.0
    for first in range(0, out.shape[0], shape.micro_batch):
        part = slice(first, first + shape.micro_batch)
        attention = torch.cat([torch.ones_like(rows[part]), mask[part]], dim=1)
        # logits only for the positions that predict completion tokens: the LM head over
        # the prompt would cost a vocabulary-wide projection per prompt token for nothing
        logits = policy(
            input_ids=out[part], attention_mask=attention, logits_to_keep=n_new + 1
        ).logits[:, :-1]
        logps = (
            torch.log_softmax(logits.float(), dim=-1)
            .gather(-1, completions[part].unsqueeze(-1))
            .squeeze(-1)
        )
        loss = -(advantages[part] * logps * mask[part].float()).sum() / total_tokens
        loss.backward()
        loss_sum += float(loss.detach())
    grad_norm = torch.nn.utils.clip_grad_norm_(
        [p for p in policy.parameters() if p.requires_grad], 1.0
    )
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    finished = time.perf_counter()
    return {
        "step_s": finished - started,
        "generate_s": generated - started,
        "loss_backward_s": finished - generated,
        "loss": loss_sum,
        "grad_norm": float(grad_norm),
        "reward_mean": float(rewards.mean()),
        "completion_tokens": int(mask.sum()),
    }


def room_for_another_step(remaining_s: float, step_times: Sequence[float]) -> bool:
    """Whether one more step, as slow as the slowest so far and a margin for writing the
    report, fits in ``remaining_s``: each step decides after itself, so one step's room is
    all it needs."""
    return remaining_s >= 1.25 * max(step_times) + 30


def run_self_contained_grpo(
    policy: Any,
    prompt_ids: list[list[int]],
    shape: RunShape,
    tokenizer_ids: tuple[int | None, int | None],
    device: str,
    budget: Budget | None,
    on_step_end: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """``shape.steps`` self-contained GRPO steps (one warm-up first, not timed: it includes
    CUDA kernel selection and allocator growth)."""
    import torch

    eos, pad = tokenizer_ids
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-5)
    prompts = torch.tensor(prompt_ids, device=device)

    def step() -> dict[str, float]:
        record = self_contained_grpo_step(policy, optimizer, prompts, shape, eos, pad, device)
        if on_step_end is not None:
            on_step_end()
        return record

    warmup = step()
    records: list[dict[str, float]] = []
    for _ in range(shape.steps):
        slowest = [warmup["step_s"], *(r["step_s"] for r in records)]
        if budget is not None and not room_for_another_step(budget.remaining(), slowest):
            break
        records.append(step())
    return {
        "impl": "self-contained: on-policy GRPO gradient, group-standardised rewards, "
        "token-mean loss in micro-batches, AdamW on LoRA",
        "warmup_step_s": round(warmup["step_s"], 3),
        "steps_timed": len(records),
        "step_s": [round(r["step_s"], 3) for r in records],
        "median_step_s": round(statistics.median(r["step_s"] for r in records), 3)
        if records
        else None,
        "generate_s": [round(r["generate_s"], 3) for r in records],
        "loss": [r["loss"] for r in records],
        "grad_norm": [r["grad_norm"] for r in records],
        "completion_tokens": [r["completion_tokens"] for r in records],
    }


def trl_trainer_class(prefer_project: bool = True) -> tuple[type, str]:
    """The project's ``ConductorGRPOTrainer`` if its package imports (it needs the project's
    full dependencies), else TRL's ``GRPOTrainer``; on CUDA both run TRL's own code paths."""
    if prefer_project:
        try:
            from conductor_pipeline.training.trainer import ConductorGRPOTrainer

            return ConductorGRPOTrainer, "trl:ConductorGRPOTrainer"
        except Exception:  # noqa: BLE001 - e.g. litellm missing on a bare GPU image
            pass
    from trl import GRPOTrainer

    return GRPOTrainer, "trl:GRPOTrainer"


def run_trl_grpo(
    folder: Path,
    tokenizer: Any,
    prompts: list[str],
    shape: RunShape,
    device: str,
    workdir: Path,
    budget: Budget | None = None,
    on_step_end: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """``shape.steps`` GRPO steps through TRL, configured as the GPU profile trains (bf16,
    gradient checkpointing, LoRA, micro-batches with gradient accumulation, no KL), with
    colocated vLLM generation when ``shape.use_vllm``. Every completion runs to
    ``shape.completion_tokens`` (EOS ignored): the worst case for time and memory. Step
    times come from a callback around each optimizer step."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig

    cuda = device == "cuda"
    trainer_cls, impl = trl_trainer_class()
    timings: list[float] = []
    # Without vLLM, transformers' generate holds the rollouts' KV cache in PyTorch's pool;
    # colocated vLLM holds it in its own share instead. So the loss phase (from the step's
    # first micro-batch on) is measured apart: its peak plus vLLM's share is the run's.
    phases: dict[str, Any] = {"fresh": False, "generation": [], "loss": []}

    def device_peak_gib() -> float:
        """The pool's peak since the last reset, plus what the device holds outside the
        pool (the CUDA context)."""
        outside = device_used_gib(device) - torch.cuda.memory_reserved() / GIB
        return torch.cuda.max_memory_reserved() / GIB + outside

    class LossPhasePeak(trainer_cls):  # type: ignore[misc, valid-type]
        def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
            if phases["fresh"]:
                phases["fresh"] = False
                synchronize(device)
                phases["generation"].append(device_peak_gib())
                torch.cuda.empty_cache()  # generation's cached blocks: vLLM's to hold
                torch.cuda.reset_peak_memory_stats()
            return super().compute_loss(*args, **kwargs)

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            synchronize(device)
            phases["fresh"] = True
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            synchronize(device)
            timings.append(time.perf_counter() - self.t0)
            if phases["generation"]:
                phases["loss"].append(device_peak_gib())
            if on_step_end is not None:
                on_step_end()
            # stop early rather than be cut off by the watchdog with nothing recorded
            if budget is not None and not room_for_another_step(budget.remaining(), timings):
                control.should_training_stop = True

    def reward_fn(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        return [synthetic_reward(ids) for ids in completion_ids]

    # the first step is a warm-up (kernel selection, allocator growth, vLLM graph capture)
    dataset = Dataset.from_dict({"prompt": prompts * (shape.steps + 1)})
    extra: dict[str, Any] = {"generation_kwargs": {"min_new_tokens": shape.completion_tokens}}
    if shape.use_vllm:
        extra = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": shape.vllm_gpu_memory_utilization,
            "generation_kwargs": {"ignore_eos": True},
        }
    args = GRPOConfig(
        output_dir=str(workdir / ("trl-vllm" if shape.use_vllm else "trl")),
        max_steps=shape.steps + 1,
        num_generations=shape.group,
        per_device_train_batch_size=shape.micro_batch,
        gradient_accumulation_steps=shape.rows_per_step // shape.micro_batch,
        max_completion_length=shape.completion_tokens,
        temperature=1.0,
        learning_rate=1e-5,
        loss_type=shape.loss_type,
        beta=0.0,
        num_iterations=1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        use_cpu=not cuda,
        bf16=cuda,
        gradient_checkpointing=cuda and shape.gradient_checkpointing,
        dataloader_num_workers=0,
        **extra,
    )
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.bfloat16 if cuda else torch.float32
    )
    trainer = (LossPhasePeak if cuda and not shape.use_vllm else trainer_cls)(
        model=model,
        reward_funcs=[reward_fn],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(shape.lora),
        callbacks=[StepTimer()],
    )
    trainer.train()
    # the first logged step is the warm-up, as the first timing is
    logs = [entry for entry in trainer.state.log_history if "loss" in entry][1:]
    timed = timings[1:]
    result = {
        "impl": impl + (" + vLLM colocate" if shape.use_vllm else ""),
        "warmup_step_s": round(timings[0], 3) if timings else None,
        "steps_timed": len(timed),
        "step_s": [round(t, 3) for t in timed],
        "median_step_s": round(statistics.median(timed), 3) if timed else None,
        "loss": [entry.get("loss") for entry in logs],
        "grad_norm": [entry.get("grad_norm") for entry in logs],
        "completion_length_mean": [entry.get("completions/mean_length") for entry in logs],
    }
    if phases["loss"]:
        result["phase_peaks_gib"] = {
            name: round(max(phases[name]), 2) for name in ("generation", "loss")
        }
    del trainer, model
    if cuda:
        torch.cuda.empty_cache()
    return result
