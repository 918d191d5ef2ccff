"""Shared fixtures: a tiny random Llama with the SmolLM2 tokenizer, saved as a model folder."""

from __future__ import annotations

from pathlib import Path

import pytest


def smollm2_tokenizer():
    """SmolLM2's tokenizer: from the plain-copy cache if present, else from the GGUF."""
    from transformers import AutoTokenizer

    from conductor_pipeline.workers.local_model import (
        _cache_complete,
        default_cache_dir,
        smollm2_gguf_path,
    )

    cache = default_cache_dir()
    if _cache_complete(cache):
        tokenizer = AutoTokenizer.from_pretrained(cache)
    else:
        gguf = smollm2_gguf_path()
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A 6.4M-parameter random LlamaForCausalLM + SmolLM2 tokenizer (stack-notes §9)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = smollm2_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
