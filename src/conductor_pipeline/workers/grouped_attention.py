"""Attention for the Conductor's batches: transformers' SDPA attention, except that grouped
keys and values reach the kernel uncopied (:func:`use_grouped_attention`), and that a batch
can be fed packed (:class:`PackedRows`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

_GROUPED_SDPA = "conductor_grouped_sdpa"


@dataclass(frozen=True)
class PackedRows:
    """Where the tokens of a packed pass sit in the padded batch they stand for.

    A batched decoding pass feeds each row a different number of tokens (its newest token
    and its guess). Padded, every row gets as many columns as the longest, and the
    projections and the MLP, nearly all of a pass's arithmetic, also run on the pads: in a
    16-row batch about a sixth of them. Packed, the rows' tokens go in as one sequence
    ``(1, tokens)``; only attention, which needs each row's own keys, sees the padded
    layout ``(rows, width)``: the new keys and values are unpacked into it before they join
    the cache (:func:`packed_cache`), the queries before the kernel and the outputs packed
    again after it (:func:`_grouped_sdpa`). Pads get zero keys that the mask hides.

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


def packed_cache(cache: Any, packed_rows: PackedRows) -> Any:
    """A view of ``cache`` (a ``DynamicCache``) for one packed pass: the same layers, so
    what the pass adds lands in ``cache``, but each layer's new keys and values are
    unpacked to the padded layout first."""
    return _packed_cache_class()(cache.layers, packed_rows)


def supports_packed_rows(model: Any) -> bool:
    """Whether ``model`` attends with :func:`_grouped_sdpa`, the one attention that reads
    ``packed_rows`` (any other would ignore it and mix the rows up)."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == _GROUPED_SDPA


@functools.cache
def _packed_cache_class() -> type:
    from transformers import DynamicCache

    class PackedCache(DynamicCache):
        def __init__(self, layers: list[Any], packed_rows: PackedRows) -> None:
            super().__init__()
            self.layers = layers  # shared: updates reach the padded cache
            self.packed_rows = packed_rows

        def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any) -> Any:
            unpack = self.packed_rows.unpack
            return _append(self.layers[layer_idx], unpack(key_states), unpack(value_states))

    return PackedCache


def _append(layer: Any, keys: Any, values: Any) -> tuple[Any, Any]:
    """Add columns to a cache layer's keys and values in place: they are views of buffers
    with room to spare (``layer.room``), where transformers' layer copies the whole cache to
    append a pass's columns (a tenth of a 16-row batch's time on a CPU). A layer whose
    tensors are no longer views of its buffers (rows stacked, columns compacted) gets new
    buffers, its columns copied once."""
    rows, columns, added = keys.shape[0], layer.keys.shape[-2], keys.shape[-2]
    room = getattr(layer, "room", None)
    if not (
        room is not None
        and _views_of(layer, room)
        and rows <= room[0].shape[0]
        and columns + added <= room[0].shape[-2]
    ):
        room = _new_room(layer, rows, columns, columns + added)
    room[0][:rows, :, columns : columns + added] = keys
    room[1][:rows, :, columns : columns + added] = values
    layer.keys = room[0][:rows, :, : columns + added]
    layer.values = room[1][:rows, :, : columns + added]
    return layer.keys, layer.values


def stack_rows(layer: Any, keys: Any, values: Any, width: int) -> None:
    """Put new rows' ``keys`` and ``values`` under ``layer``'s rows, each row right-aligned
    in ``width`` columns with hidden zeros on its left. When the layer's buffers have free
    rows and the live rows already span ``width`` columns, the new rows are written into
    them and the live rows stay where they are; otherwise new buffers, with room for more
    rows and for the next passes' appends (:func:`_append`), take both sides, copied once."""
    live, added = layer.keys.shape[0], keys.shape[0]
    rows = live + added
    room = getattr(layer, "room", None)
    in_place = (
        room is not None
        and _views_of(layer, room)
        and layer.keys.shape[2] == width
        and rows <= room[0].shape[0]
    )
    if not in_place:
        room = _new_room(layer, rows, width, width)
    for buffer, bottom in zip(room, (keys, values), strict=True):
        _right_aligned_into(buffer[live:rows], bottom, width)
    layer.keys, layer.values = room[0][:rows, :, :width], room[1][:rows, :, :width]


def _new_room(layer: Any, rows: int, width: int, columns: int) -> tuple[Any, Any]:
    """New buffers for ``layer``, kept as ``layer.room``: room for ``rows`` rows and
    ``columns`` columns and spare ones of each, the layer's rows copied in, right-aligned in
    ``width`` columns (hidden zeros on their left)."""
    keys = layer.keys
    shape = (rows + _SPARE_ROWS, keys.shape[1], columns + _SPARE_COLUMNS, keys.shape[3])
    room = (keys.new_empty(shape), layer.values.new_empty(shape))
    live = keys.shape[0]
    for buffer, tensor in zip(room, (keys, layer.values), strict=True):
        _right_aligned_into(buffer[:live], tensor, width)
    layer.room = room
    return room


def _right_aligned_into(buffer: Any, tensor: Any, width: int) -> None:
    """Write ``tensor`` into the first ``width`` columns of ``buffer``, right-aligned, zeros
    on its left."""
    pads = width - tensor.shape[2]
    buffer[:, :, :pads] = 0
    buffer[:, :, pads:width] = tensor


def _views_of(layer: Any, room: tuple[Any, Any]) -> bool:
    """Whether the layer's keys and values are the leading rows and columns of ``room``."""
    return (
        layer.keys.data_ptr() == room[0].data_ptr()
        and layer.values.data_ptr() == room[1].data_ptr()
        and layer.keys.stride() == room[0].stride()
    )


# rows a layer's new buffers keep free for rows joining later
_SPARE_ROWS = 8
# columns a layer's buffers keep free for the next passes (a pass adds up to 9)
_SPARE_COLUMNS = 64


def _grouped_sdpa(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    packed_rows: PackedRows | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' SDPA attention, except that grouped keys and values (SmolLM2: 3 key/value
    heads for 9 query heads) reach the kernel as they are, also under a padding mask.
    transformers copies them to one per query head whenever a mask is given, i.e. in every
    padded batch; on a CPU that copy was 30 % of a 16-row decode step (the same values: the
    kernel groups the heads itself, as transformers already has it do without a mask).
    With ``packed_rows`` the queries come packed and the output goes back packed."""
    import torch

    if packed_rows is not None:
        query = packed_rows.unpack(query)
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
    ).transpose(1, 2)
    if packed_rows is not None:
        return packed_rows.pack(out), None
    return out.contiguous(), None


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
