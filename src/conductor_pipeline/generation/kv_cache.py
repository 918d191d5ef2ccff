"""Key/value caches of the engine's batches: preallocated buffers that passes append into in
place, where transformers' ``DynamicLayer`` concatenates the whole cache again at every pass
(a tenth of a 16-row batch's time on a CPU).

One buffer manager serves every batch: :func:`append_columns` and :func:`stack_rows` keep a
layer's tensors as views of buffers with room to spare (``layer.room``); batches reach it
through :func:`packed_cache` (rows join and leave, rows fed packed). :func:`cache_from` lends
a prompt's keys and values to many rows without a copy (the kept opening of served prompts,
the prompts of scored GRPO groups).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from conductor_pipeline.generation.attention import PackedRows

__all__ = [
    "KV",
    "SPARE_COLUMNS",
    "SPARE_ROWS",
    "append_columns",
    "cache_from",
    "packed_cache",
    "room_rows",
    "stack_rows",
]

KV = list[tuple[torch.Tensor, torch.Tensor] | None]  # per decoder layer; None: not computed


def cache_from(kv: KV | None, rows: int = 1, n_layers: int = 0) -> Cache:
    """A transformers cache holding ``kv`` broadcast to ``rows`` rows without a copy (or an
    empty one of ``n_layers`` layers); layers without states stay empty. A pass appends to a
    layer into new tensors (:func:`append_columns` finds no room), so nothing writes to
    ``kv``: a kept prompt opening serves any number of batches."""
    layers = []
    for entry in kv if kv is not None else [None] * n_layers:
        layer = DynamicLayer()
        if entry is not None:
            keys, values = entry
            layer.lazy_initialization(keys, values)
            layer.keys = keys.expand(rows, -1, -1, -1)
            layer.values = values.expand(rows, -1, -1, -1)
        layers.append(layer)
    return Cache(layers=layers)


# rows a layer's new buffers keep free for rows joining later
SPARE_ROWS = 8
# columns a layer's buffers keep free for the next passes (a pass adds up to 9)
SPARE_COLUMNS = 64


def packed_cache(cache: Any, packed_rows: PackedRows) -> Any:
    """A view of ``cache`` (a ``DynamicCache``) for one packed pass: the same layers, so
    what the pass adds lands in ``cache``, but each layer's new keys and values are
    unpacked to the padded layout first."""
    return _packed_cache_class()(cache.layers, packed_rows)


@functools.cache
def _packed_cache_class() -> type:
    class PackedCache(DynamicCache):
        def __init__(self, layers: list[Any], packed_rows: PackedRows) -> None:
            super().__init__()
            self.layers = layers  # shared: updates reach the padded cache
            self.packed_rows = packed_rows

        def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any) -> Any:
            unpack = self.packed_rows.unpack
            layer = self.layers[layer_idx]
            append_columns(layer, unpack(key_states), unpack(value_states))
            return room_rows(layer)

    return PackedCache


def append_columns(layer: Any, keys: Any, values: Any) -> tuple[Any, Any]:
    """Add columns to a cache layer's keys and values in place: they are views of buffers
    with room to spare (``layer.room``). A layer whose tensors are no longer views of its
    buffers (rows stacked, columns compacted) gets new buffers, its columns copied once."""
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


def room_rows(layer: Any) -> tuple[Any, Any]:
    """The layer's rows across all the columns of its buffers: what a packed pass attends
    over. The columns past the layer's are zeros that the pass's mask does not reach
    (:func:`~conductor_pipeline.generation.attention.grouped_sdpa` hides them). A batched
    matrix product copies its operand first when its matrices are not back to back in
    memory, as those of ``layer.keys`` are not (each row's spare columns lie between them):
    in bfloat16 on a CPU that copy was most of a decoding pass's attention (32 rows over
    400 keys: 2.8 ms a layer, 1.3 ms over the whole buffers)."""
    rows = layer.keys.shape[0]
    return layer.room[0][:rows], layer.room[1][:rows]


def stack_rows(layer: Any, keys: Any, values: Any, width: int) -> None:
    """Put new rows' ``keys`` and ``values`` under ``layer``'s rows, each row right-aligned
    in ``width`` columns with hidden zeros on its left. When the layer's buffers have free
    rows and the live rows already span ``width`` columns, the new rows are written into
    them and the live rows stay where they are; otherwise new buffers, with room for more
    rows and for the next passes' appends (:func:`append_columns`), take both sides, copied
    once."""
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
    ``width`` columns (hidden zeros on their left). The columns past ``width`` are zeros
    until written (:func:`room_rows` attends over them)."""
    keys = layer.keys
    shape = (rows + SPARE_ROWS, keys.shape[1], columns + SPARE_COLUMNS, keys.shape[3])
    room = (keys.new_empty(shape), layer.values.new_empty(shape))
    live = keys.shape[0]
    for buffer, tensor in zip(room, (keys, layer.values), strict=True):
        _right_aligned_into(buffer[:live], tensor, width)
        buffer[:, :, width:] = 0
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
