"""GRPO steps to time: through TRL (the project's trainer or TRL's own), or a
self-contained step where TRL is not importable."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conductor_pipeline.gpu_check.environment import synchronize
from conductor_pipeline.gpu_check.model import lora_config
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
    group: int,
    max_new_tokens: int,
    eos_token_id: int | None,
    pad_token_id: int | None,
    device: str,
) -> dict[str, float]:
    """One on-policy GRPO step without TRL: sample ``group`` completions per prompt,
    standardise rewards within each group, minimise the token-mean of
    ``-advantage * log p``. With one iteration per batch GRPO's clipped ratio is 1, so
    this is its gradient (no KL term, as in the GPU profile's ``beta: 0``)."""
    import torch

    started = time.perf_counter()
    rows = prompts.repeat_interleave(group, dim=0)
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
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_token_id if pad_token_id is not None else eos_token_id,
            eos_token_id=eos_token_id,
        )
    completions = out[:, prompt_len:]
    mask = completion_mask(completions, eos_token_id).to(out.device)
    synchronize(device)
    generated = time.perf_counter()

    rewards = synthetic_rewards(completions.cpu(), mask.cpu()).view(-1, group)
    advantages = (rewards - rewards.mean(dim=1, keepdim=True)) / (
        rewards.std(dim=1, keepdim=True) + 1e-4
    )
    advantages = advantages.view(-1, 1).to(out.device)

    policy.train()
    attention = torch.cat([torch.ones_like(rows), mask], dim=1)
    n_new = completions.shape[1]
    # logits only for the positions that predict completion tokens: the LM head over the
    # prompt would cost a vocabulary-wide projection per prompt token for nothing
    logits = policy(input_ids=out, attention_mask=attention, logits_to_keep=n_new + 1).logits[
        :, :-1
    ]
    logps = (
        torch.log_softmax(logits.float(), dim=-1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)
    )
    weights = mask.float()
    loss = -(advantages * logps * weights).sum() / weights.sum().clamp(min=1.0)
    loss.backward()
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
        "loss": float(loss.detach()),
        "grad_norm": float(grad_norm),
        "reward_mean": float(rewards.mean()),
        "completion_tokens": int(mask.sum()),
    }


def run_self_contained_grpo(
    policy: Any,
    prompt_ids: list[list[int]],
    group: int,
    max_new_tokens: int,
    steps: int,
    tokenizer_ids: tuple[int | None, int | None],
    device: str,
    budget: Budget | None,
    min_step_s: float = 0.0,
) -> dict[str, Any]:
    """``steps`` self-contained GRPO steps (one warm-up first, not timed: it includes CUDA
    kernel selection and allocator growth)."""
    import torch

    eos, pad = tokenizer_ids
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-5)
    prompts = torch.tensor(prompt_ids, device=device)
    step = lambda: self_contained_grpo_step(  # noqa: E731
        policy, optimizer, prompts, group, max_new_tokens, eos, pad, device
    )
    warmup = step()
    records: list[dict[str, float]] = []
    for _ in range(steps):
        if budget is not None and budget.remaining() < max(min_step_s, 2 * warmup["step_s"]):
            break
        records.append(step())
    return {
        "impl": "self-contained (TRL not importable or --no-trl): on-policy GRPO gradient, "
        "group-standardised rewards, token-mean loss, AdamW on LoRA",
        "warmup_step_s": round(warmup["step_s"], 4),
        "steps_timed": len(records),
        "step_s": [round(r["step_s"], 4) for r in records],
        "median_step_s": round(statistics.median(r["step_s"] for r in records), 4)
        if records
        else None,
        "generate_s": [round(r["generate_s"], 4) for r in records],
        "loss_backward_s": [round(r["loss_backward_s"], 4) for r in records],
        "loss": [r["loss"] for r in records],
        "grad_norm": [r["grad_norm"] for r in records],
        "reward_mean": [r["reward_mean"] for r in records],
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
    group: int,
    max_new_tokens: int,
    steps: int,
    device: str,
    lora_r: int,
    workdir: Path,
    use_vllm: bool = False,
    vllm_gpu_memory_utilization: float = 0.3,
    budget: Budget | None = None,
) -> dict[str, Any]:
    """``steps`` GRPO steps through TRL, configured as the GPU profile trains (bf16, gradient
    checkpointing, LoRA on all projections, ``bnpo`` loss, no KL), optionally generating with
    colocated vLLM. Step times come from a callback around each optimizer step."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig

    cuda = device == "cuda"
    trainer_cls, impl = trl_trainer_class()
    timings: list[float] = []

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            synchronize(device)
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            synchronize(device)
            timings.append(time.perf_counter() - self.t0)
            # stop early rather than be cut off by the watchdog with nothing recorded
            if budget is not None and budget.remaining() < 2 * max(timings) + 30:
                control.should_training_stop = True

    def reward_fn(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        return [synthetic_reward(ids) for ids in completion_ids]

    n_prompts = len(prompts)
    # the first step is a warm-up (kernel selection, allocator growth, vLLM graph capture)
    dataset = Dataset.from_dict({"prompt": prompts * (steps + 1)})
    extra: dict[str, Any] = {}
    if use_vllm:
        extra = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": vllm_gpu_memory_utilization,
        }
    args = GRPOConfig(
        output_dir=str(workdir / ("trl-vllm" if use_vllm else "trl")),
        max_steps=steps + 1,
        num_generations=group,
        per_device_train_batch_size=group,
        gradient_accumulation_steps=n_prompts,
        max_completion_length=max_new_tokens,
        temperature=1.0,
        learning_rate=1e-5,
        loss_type="bnpo",
        beta=0.0,
        num_iterations=1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        use_cpu=not cuda,
        bf16=cuda,
        gradient_checkpointing=cuda,
        dataloader_num_workers=0,
        **extra,
    )
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.bfloat16 if cuda else torch.float32
    )
    trainer = trainer_cls(
        model=model,
        reward_funcs=[reward_fn],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(lora_r),
        callbacks=[StepTimer()],
    )
    trainer.train()
    # the first logged step is the warm-up, as the first timing is
    logs = [entry for entry in trainer.state.log_history if "loss" in entry][1:]
    timed = timings[1:]
    result = {
        "impl": impl + (" + vLLM colocate" if use_vllm else ""),
        "warmup_step_s": round(timings[0], 4) if timings else None,
        "steps_timed": len(timed),
        "step_s": [round(t, 4) for t in timed],
        "median_step_s": round(statistics.median(timed), 4) if timed else None,
        "loss": [entry.get("loss") for entry in logs],
        "grad_norm": [entry.get("grad_norm") for entry in logs],
        "reward_mean": [entry.get("reward") for entry in logs],
        "reward_std": [entry.get("reward_std") for entry in logs],
        "completion_length_mean": [entry.get("completions/mean_length") for entry in logs],
    }
    del trainer, model
    if cuda:
        torch.cuda.empty_cache()
    return result
