"""Sampling throughput: the LoRA policy through ``generate``, and vLLM in-process."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from conductor_pipeline.gpu_check.environment import synchronize


def measure_generation(
    policy: Any,
    prompt_ids: list[list[int]],
    group: int,
    new_tokens: int,
    pad_token_id: int | None,
    device: str,
) -> dict[str, Any]:
    """Batched sampling throughput of the LoRA policy (as TRL's non-vLLM path generates):
    ``len(prompt_ids) * group`` rows, exactly ``new_tokens`` each (EOS cannot end a row early,
    so the token count is known), after a short warm-up."""
    import torch

    rows = torch.tensor(prompt_ids, device=device).repeat_interleave(group, dim=0)
    kwargs = dict(
        attention_mask=torch.ones_like(rows),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=pad_token_id,
    )
    policy.eval()
    with torch.inference_mode():
        policy.generate(input_ids=rows, max_new_tokens=4, min_new_tokens=4, **kwargs)
        synchronize(device)
        started = time.perf_counter()
        out = policy.generate(
            input_ids=rows, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs
        )
        synchronize(device)
        seconds = time.perf_counter() - started
    generated = int(out.shape[1] - rows.shape[1]) * int(rows.shape[0])
    return {
        "rows": int(rows.shape[0]),
        "prompt_tokens": int(rows.shape[1]),
        "new_tokens_per_row": int(out.shape[1] - rows.shape[1]),
        "seconds": round(seconds, 4),
        "tokens_per_s": round(generated / seconds, 1),
        "note": "HF generate with the LoRA adapter unmerged, KV cache on, prefill included",
    }


def measure_vllm_generation(
    folder: Path,
    prompt_ids: list[list[int]],
    group: int,
    new_tokens: int,
    gpu_memory_utilization: float,
) -> dict[str, Any]:
    """vLLM sampling in this process beside the training model (what colocate means), from
    token ids so that no tokenizer is needed; used when TRL is not importable."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(folder),
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=len(prompt_ids[0]) + new_tokens + 16,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        seed=0,
    )
    params = SamplingParams(n=group, temperature=1.0, max_tokens=new_tokens, ignore_eos=True)
    prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]
    llm.generate(prompts[:1], SamplingParams(n=1, max_tokens=4, ignore_eos=True))
    started = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - started
    generated = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {
        "impl": "vllm.LLM in-process (TRL not importable: no weight sync exercised)",
        "rows": len(prompt_ids) * group,
        "seconds": round(seconds, 4),
        "tokens_per_s": round(generated / seconds, 1),
    }
