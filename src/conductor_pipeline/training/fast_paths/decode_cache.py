"""The per-layer cache of shared-prefill decoding (:mod:`.decode`), which the grouped decode
attention (:mod:`.attention`) reads; its own module so that neither imports the other."""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

__all__ = ["DecodeLayer"]


class DecodeLayer(DynamicLayer):
    """One layer's decode cache: each prompt group's keys and values once (a padded batch
    cache holds a prompt once per row, and attention reads every copy at every token), and
    the generated tokens' per row in preallocated buffers (``DynamicLayer`` concatenates
    the whole cache again at every token)."""

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
