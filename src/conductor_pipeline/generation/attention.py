"""The engine's one attention: transformers' SDPA attention, except that grouped key/value
heads reach the kernel uncopied and a batch can be fed packed (:class:`PackedRows`).

transformers copies grouped keys and values to one per query head whenever a mask is given
(SmolLM2: 3 key/value heads for 9 query heads), i.e. in every padded batch and at every
decoding step; on a CPU that copy was 30 % of a 16-row decode step. The kernel groups the
heads itself (``enable_gqa``): the same arithmetic.

A model attends this way for good (:func:`use_grouped_attention`, serving and evaluation) or
inside a block (:func:`grouped_attention`, GRPO rollouts and scoring, whose model TRL also
runs through its own code). Both switch to the one registered function,
:data:`GROUPED_ATTENTION`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

__all__ = [
    "GROUPED_ATTENTION",
    "PackedRows",
    "grouped_attention",
    "grouped_sdpa",
    "supports_packed_rows",
    "unwrapped_model",
    "use_grouped_attention",
]

GROUPED_ATTENTION = "conductor_grouped_sdpa"


@dataclass(frozen=True)
class PackedRows:
    """Where the tokens of a packed pass sit in the padded batch they stand for.

    A batched decoding pass feeds each row a different number of tokens (its newest token
    and its guess). Padded, every row gets as many columns as the longest, and the
    projections and the MLP, nearly all of a pass's arithmetic, also run on the pads: in a
    16-row batch about a sixth of them. Packed, the rows' tokens go in as one sequence
    ``(1, tokens)``; only attention, which needs each row's own keys, sees the padded
    layout ``(rows, width)``: the new keys and values are unpacked into it before they join
    the cache (:func:`~conductor_pipeline.generation.kv_cache.packed_cache`), the queries
    before the kernel and the outputs packed again after it (:func:`grouped_sdpa`). Pads get
    zero keys that the mask hides.

    ``rows_at[t]``, ``columns_at[t]``: the row and column of packed token ``t``."""

    rows_at: Any  # (tokens,) long tensor
    columns_at: Any  # (tokens,) long tensor
    rows: int
    width: int

    def unpack(self, packed: Any) -> Any:
        """``(1, heads, tokens, dim)`` -> ``(rows, heads, width, dim)``, zeros at the pads."""
        heads, dim = packed.shape[1], packed.shape[3]
        padded = packed.new_zeros(self.rows, self.width, heads, dim)
        padded[self.rows_at, self.columns_at] = packed[0].transpose(0, 1)
        return padded.transpose(1, 2)

    def pack(self, padded: Any) -> Any:
        """``(rows, width, heads, dim)`` -> ``(1, tokens, heads, dim)``."""
        return padded[self.rows_at, self.columns_at].unsqueeze(0)


def grouped_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    packed_rows: PackedRows | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention with grouped key/value heads broadcast by the kernel.

    ``packed_rows`` (a model call's keyword, passed through to attention): the queries come
    packed and the output goes back packed."""
    if packed_rows is not None:
        query = packed_rows.unpack(query)
    q_length = query.shape[2]
    # on a CPU, SDPA is several times slower for one query a row in bfloat16 than in
    # float32, and that is every decoding pass in which no row checks a guess
    one_query = q_length == 1 and query.dtype == torch.bfloat16 and query.device.type == "cpu"
    if attention_mask is not None and attention_mask.shape[-1] < key.shape[2]:
        # a packed pass's keys and values span its cache's whole buffers, the columns past
        # the mask never written (kv_cache.room_rows): the single-query products read them,
        # hidden (they would copy the narrower view first); SDPA reads the view
        columns = attention_mask.shape[-1]
        if one_query:
            hidden = False if attention_mask.dtype == torch.bool else float("-inf")
            attention_mask = F.pad(attention_mask, (0, key.shape[2] - columns), value=hidden)
        else:
            key, value = key[:, :, :columns], value[:, :, :columns]
    kv_length = key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal and q_length > 1 and attention_mask is None)
    if causal and kv_length != q_length:
        # SDPA aligns is_causal top-left; the queries are the last q_length positions
        attention_mask = torch.ones(q_length, kv_length, dtype=torch.bool, device=query.device)
        attention_mask = attention_mask.tril(kv_length - q_length)
        causal = False
    if one_query:
        out = _one_query(query, key, value, attention_mask, scaling, dropout).transpose(1, 2)
    else:
        out = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=dropout,
            scale=scaling,
            is_causal=causal,
            enable_gqa=key.shape[1] != query.shape[1],
        ).transpose(1, 2)
    if packed_rows is not None:
        return packed_rows.pack(out), None
    return out.contiguous(), None


def _one_query(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    dropout: float,
) -> torch.Tensor:
    """Attention of one query a row, ``(rows, heads, 1, dim)``, as two batched matrix
    products: the query heads that share a key/value head stand in for its query positions,
    so nothing is copied per head, and the softmax runs in float32. In bfloat16 on 2 CPU
    cores, 16 rows over 700 keys took 0.7 ms a layer this way, against 3.4 ms through SDPA
    in float32 (casts included) and 11 ms through SDPA in bfloat16."""
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(rows, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)) * (scaling or dim**-0.5)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, float("-inf"))
    elif attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32)
    weights = F.dropout(weights, p=dropout) if dropout else weights
    return torch.matmul(weights.to(value.dtype), value).reshape(rows, heads, 1, dim)


AttentionInterface.register(GROUPED_ATTENTION, grouped_sdpa)
AttentionMaskInterface.register(GROUPED_ATTENTION, sdpa_mask)


def unwrapped_model(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def use_grouped_attention(model: Any) -> None:
    """Switch an SDPA ``model`` to :func:`grouped_sdpa` for good (same masks); other attention
    implementations are left alone."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(GROUPED_ATTENTION)


@contextlib.contextmanager
def grouped_attention(model: Any) -> Iterator[bool]:
    """Run an SDPA ``model`` with :func:`grouped_sdpa` while inside (the switch is on the
    model's config and undone on exit); yields whether it is active."""
    config = unwrapped_model(model).config
    current = config._attn_implementation
    if current != "sdpa":
        yield current == GROUPED_ATTENTION
        return
    config._attn_implementation = GROUPED_ATTENTION
    try:
        yield True
    finally:
        config._attn_implementation = current


def supports_packed_rows(model: Any) -> bool:
    """Whether ``model`` attends with :func:`grouped_sdpa`, the one attention that reads
    ``packed_rows`` (any other would ignore it and mix the rows up)."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == GROUPED_ATTENTION
