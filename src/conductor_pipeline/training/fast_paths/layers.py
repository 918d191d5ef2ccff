"""The parts of a Llama-layout decoder the fast paths drive directly: the decoder stack and
LM head, which layers are frozen, running the layers from one index on, and recording the
hidden states that enter a layer (:class:`FrozenStates`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache

from conductor_pipeline.generation.attention import unwrapped_model

__all__ = [
    "FastPathUnsupported",
    "FrozenStates",
    "backbone_and_head",
    "causal_mask",
    "first_trainable_layer",
    "run_layers",
]


class FastPathUnsupported(RuntimeError):
    """The model or the batch needs something the fast paths do not do; use TRL's path."""


# -- the model's anatomy -------------------------------------------------------------------------

# Model types whose decoder layers this module calls one by one (transformers' Llama layout:
# embed_tokens, layers, rotary_emb, norm; a layer takes position_embeddings).
_LAYER_STACK_MODELS = ("llama",)


def backbone_and_head(model: Any) -> tuple[Any, Any]:
    """The decoder stack (hidden states after the final norm) and the LM head. LoRA lives
    in the stack's modules, so calling it directly keeps the adapter (TRL's fused head
    calls it the same way)."""
    base = unwrapped_model(model)
    return getattr(base, base.base_model_prefix), base.get_output_embeddings()


def first_trainable_layer(model: Any) -> int:
    """Index of the first decoder layer holding a trainable parameter, when the embeddings
    and every layer below it are frozen (LoRA on the last layers); 0 when nothing below a
    layer is frozen or the layer stack is not one this module drives."""
    base = unwrapped_model(model)
    if getattr(base.config, "model_type", None) not in _LAYER_STACK_MODELS:
        return 0
    backbone, _ = backbone_and_head(model)
    if any(p.requires_grad for p in backbone.embed_tokens.parameters()):
        return 0
    for index, layer in enumerate(backbone.layers):
        if any(p.requires_grad for p in layer.parameters()):
            return index
    return 0


def causal_mask(queries: int, keys: int, rows: int, device: torch.device) -> torch.Tensor:
    """Boolean SDPA mask: the queries are the last ``queries`` of ``keys`` positions."""
    mask = torch.ones(queries, keys, dtype=torch.bool, device=device).tril(keys - queries)
    return mask.expand(rows, 1, queries, keys)


def run_layers(
    backbone: Any,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    cache: Cache | None,
    first: int,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """The decoder layers from ``first`` on, then the final norm (Llama layout). ``cache``:
    the keys and values before ``hidden``'s positions (``None``: none); ``mask``: ``None``
    for causal attention within ``hidden`` alone."""
    position_embeddings = backbone.rotary_emb(hidden, position_ids=positions)
    for layer in backbone.layers[first : backbone.config.num_hidden_layers]:
        hidden = layer(
            hidden,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            position_embeddings=position_embeddings,
        )
    return backbone.norm(hidden)


@dataclass
class FrozenStates:
    """Hidden states entering decoder layer ``layer``, recorded while generating.

    The embeddings and the layers below ``layer`` are frozen (:func:`first_trainable_layer`),
    so these states are what the loss pass would compute again: scoring starts at ``layer``.
    ``prompts[prompt]``: the states of all prompt tokens but the last; ``rollouts[(prompt,
    completion)]``: the states of the tokens fed while decoding, the last prompt token and
    the completion without its last token.
    """

    backbone: Any
    layer: int
    uses: int = 0  # scoring passes that started from these states
    prompts: dict[tuple[int, ...], torch.Tensor] = field(default_factory=dict)
    rollouts: dict[tuple[tuple[int, ...], tuple[int, ...]], torch.Tensor] = field(
        default_factory=dict
    )
