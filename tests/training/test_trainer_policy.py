"""The recursion stage's round-1 generation from the model being trained."""

from __future__ import annotations

import asyncio

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conductor_pipeline.training.models import TrainerPolicy


def test_round_one_generates_on_one_torch_thread(tiny_model_dir):
    # the executor's thread would otherwise take the trainer's count (torch sets a new
    # thread's count to the last one set in the process) and keep an OpenMP team of its own
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    counts: list[int] = []
    model.register_forward_pre_hook(lambda *_: counts.append(torch.get_num_threads()))
    policy = TrainerPolicy(model, tokenizer, max_new_tokens=3, temperature=1.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the trainer's count
    try:
        texts = asyncio.run(policy.complete_batch([[{"role": "user", "content": "2 + 2?"}]]))
    finally:
        torch.set_num_threads(threads)
    assert len(texts) == 1
    assert counts and set(counts) == {1}
    assert torch.get_num_threads() == threads  # the caller's own count is untouched
