"""Attention for the Conductor's padded batches: transformers' SDPA attention, except that
grouped keys and values reach the kernel uncopied (:func:`use_grouped_attention`)."""

from __future__ import annotations

from typing import Any

_GROUPED_SDPA = "conductor_grouped_sdpa"


def _grouped_sdpa(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' SDPA attention, except that grouped keys and values (SmolLM2: 3 key/value
    heads for 9 query heads) reach the kernel as they are, also under a padding mask.
    transformers copies them to one per query head whenever a mask is given, i.e. in every
    padded batch; on a CPU that copy was 30 % of a 16-row decode step (the same values: the
    kernel groups the heads itself, as transformers already has it do without a mask)."""
    import torch

    q_length, kv_length = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(q_length > 1 and attention_mask is None and causal)
    if causal and kv_length > q_length:  # as transformers: only a prefill of an empty cache
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=getattr(module, "num_key_value_groups", 1) > 1,
    )
    return out.transpose(1, 2).contiguous(), None


def use_grouped_attention(model: Any) -> None:
    """Switch ``model`` from SDPA to :func:`_grouped_sdpa` (same masks); other attention
    implementations are left alone."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return
    AttentionInterface.register(_GROUPED_SDPA, _grouped_sdpa)
    AttentionMaskInterface.register(_GROUPED_SDPA, sdpa_mask)
    model.set_attn_implementation(_GROUPED_SDPA)
