"""SDPA attention that lets the kernel broadcast grouped key/value heads, and the decode
attention of rows sharing a prompt cache.

transformers' SDPA path repeats grouped key/value heads in memory whenever a mask is
passed; at decode time that copies the whole cache three times per layer and token
(SmolLM2). The attention registered here (``GQA_ATTENTION``) does the same arithmetic with
``enable_gqa``. :func:`gqa_attention` switches a model to it for the duration of a block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

if TYPE_CHECKING:
    from conductor_pipeline.training.fast_paths.decode_cache import DecodeLayer

__all__ = ["GQA_ATTENTION", "gqa_attention", "grouped_decode_attention", "unwrapped_model"]

GQA_ATTENTION = "conductor_sdpa_gqa"


def _sdpa_gqa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, but grouped key/value heads are broadcast by the kernel
    (``enable_gqa``); transformers repeats them in memory whenever a mask is passed, which
    at decode time copies the whole cache three times per layer and token (SmolLM2).
    Decoding with a ``grouped_decode`` cache goes to :func:`grouped_decode_attention`."""
    decode = kwargs.get("grouped_decode")
    if decode is not None:
        layer = decode.layers[module.layer_idx]
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return grouped_decode_attention(query, layer, decode.spans, scale), None
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal and q_len > 1 and attention_mask is None)
    if causal and kv_len != q_len:
        # SDPA aligns is_causal top-left; queries here are the last q_len positions
        attention_mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device)
        attention_mask = attention_mask.tril(kv_len - q_len)
        causal = False
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def grouped_decode_attention(
    query: torch.Tensor, layer: DecodeLayer, spans: list[tuple[int, int, int]], scaling: float
) -> torch.Tensor:
    """One new token per row attending to its group's prompt (read once for the group's
    rows) and to its own generated tokens, the two score blocks under one softmax.
    ``query``: (rows, heads, 1, dim); returns (rows, 1, heads, dim)."""
    rows, heads, _, dim = query.shape
    kv_heads = layer.keys.shape[1]
    per_kv = heads // kv_heads
    query = query.view(rows, kv_heads, per_kv, dim)
    generated = torch.matmul(query, layer.keys.transpose(-1, -2))  # rows, kv, per_kv, t
    outputs = []
    for group, start, end in spans:
        keys, values = layer.prompts[group]
        n, length = end - start, keys.shape[2]
        grouped = query[start:end].transpose(0, 1).reshape(kv_heads, n * per_kv, dim)
        prompt = torch.matmul(grouped, keys[0].transpose(-1, -2))
        prompt = prompt.view(kv_heads, n, per_kv, length).transpose(0, 1)
        probs = torch.cat([prompt, generated[start:end]], dim=-1).mul_(scaling).softmax(dim=-1)
        from_prompt = probs[..., :length].transpose(0, 1).reshape(kv_heads, n * per_kv, length)
        from_prompt = torch.matmul(from_prompt, values[0]).view(kv_heads, n, per_kv, dim)
        from_generated = torch.matmul(probs[..., length:], layer.values[start:end])
        outputs.append(from_prompt.transpose(0, 1) + from_generated)
    return torch.cat(outputs).view(rows, 1, heads, dim)


AttentionInterface.register(GQA_ATTENTION, _sdpa_gqa_attention)
AttentionMaskInterface.register(GQA_ATTENTION, sdpa_mask)


def unwrapped_model(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextlib.contextmanager
def gqa_attention(model: Any) -> Iterator[bool]:
    """Run an SDPA ``model`` with :func:`_sdpa_gqa_attention` while inside (the switch is on
    the model's config and undone on exit); yields whether it is active."""
    config = unwrapped_model(model).config
    current = config._attn_implementation
    if current != "sdpa":
        yield current == GQA_ATTENTION
        return
    config._attn_implementation = GQA_ATTENTION
    try:
        yield True
    finally:
        config._attn_implementation = current
