"""Sampling throughput of the LoRA policy through transformers' ``generate`` (``--generation``)."""

from __future__ import annotations

import time
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
