"""Key/value caches of the engine's batches: preallocated buffers that passes append into in
place, where transformers' ``DynamicLayer`` concatenates the whole cache again at every pass
(a tenth of a 16-row batch's time on a CPU).

Serving's batches (rows join and leave, rows fed packed): :func:`packed_cache`,
:func:`append_columns` and :func:`stack_rows` keep a layer's tensors as views of buffers with
room to spare (``layer.room``). GRPO rollouts (rows grouped by prompt): :class:`DecodeLayer`
holds each prompt group's keys and values once, the generated ones per row.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from conductor_pipeline.generation.attention import PackedRows

__all__ = [
    "SPARE_COLUMNS",
    "SPARE_ROWS",
    "DecodeLayer",
    "append_columns",
    "packed_cache",
    "stack_rows",
]

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
            return append_columns(self.layers[layer_idx], unpack(key_states), unpack(value_states))

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
    ``width`` columns (hidden zeros on their left)."""
    keys = layer.keys
    shape = (rows + SPARE_ROWS, keys.shape[1], columns + SPARE_COLUMNS, keys.shape[3])
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


class DecodeLayer(DynamicLayer):
    """One layer's cache for rows decoding on shared prompts (read by
    :func:`~conductor_pipeline.generation.attention.grouped_decode_attention`): each prompt
    group's keys and values once (a padded batch cache holds a prompt once per row, and
    attention reads every copy at every token), and the generated tokens' per row in
    preallocated buffers."""

    def __init__(
        self, prompts: list[tuple[torch.Tensor, torch.Tensor]], rows: int, width: int
    ) -> None:
        super().__init__()
        keys, values = prompts[0]
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self.prompts = prompts
        self._keys = keys.new_zeros((rows, keys.shape[1], width, keys.shape[3]))
        self._values = values.new_zeros((rows, values.shape[1], width, values.shape[3]))
        self.length = 0
        self._views()

    def _views(self) -> None:
        self.keys = self._keys[:, :, : self.length]
        self.values = self._values[:, :, : self.length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + key_states.shape[-2]
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._keys, self._values = self._keys[indices], self._values[indices]
        self._views()
