"""``ConductorGRPOTrainer``: TRL 1.16's ``GRPOTrainer`` with CPU fast paths for one GRPO step.

Where stock TRL spends a sandbox step on CPU (SmolLM2-135M, LoRA on the last 8 layers, G
rollouts for each of P prompts):

- Generation runs ``model.generate`` on a left-padded batch of all ``P * G`` rows, so each
  of the G rows of a group prefills the same prompt again. Every decoded token then pays
  for ``DynamicCache`` concatenating the whole cache again, for SDPA copying the grouped
  key/value heads (``repeat_kv``, whenever a padding mask is passed), for attention reading
  each prompt's keys once per row, and for ``torch.multinomial`` drawing one exponential
  per vocabulary entry.
- The loss runs prompt + completion through all layers for every row, though the layers
  below the LoRA are frozen and were run on the same tokens while generating, and TRL's
  fused LM head projects every position, prompt and padding included, onto the 49k-token
  vocabulary (it skips them only with Triton, which CPUs lack).

The fast paths (CPU, one process, plain temperature/top-p sampling, Llama layers for the
recorded states; anything else runs TRL's code):

1. :func:`shared_prefill_generate`: the opening all prompts share (system prompt, rules,
   workers) runs once, then each distinct prompt's own tail; the rows decode together with
   each prompt's keys and values held once for its group, the generated ones in
   preallocated buffers, and a finished row leaves the batch. Tokens are drawn from the
   distribution transformers samples from (its temperature and top-p warpers), by inverse
   CDF. The hidden states entering the first LoRA layer are recorded (:class:`FrozenStates`).
2. :func:`grouped_completion_logps`: the loss pass starts at the first LoRA layer from the
   recorded states; per group the prompt runs once with gradients (the LoRA weights act on
   its keys and values), its cache serves the group's rows, only the completion tokens run
   on top, and the LM head projects only real completion tokens.

Attention runs SDPA letting the kernel broadcast grouped key/value heads (``enable_gqa``)
instead of copying them: the same arithmetic.

Semantics versus stock TRL. Log-probabilities, entropies and LoRA gradients are the stock
ones up to float rounding (``tests/training/test_trainer_fast_path.py``). Completions follow
the same sampling distribution, EOS handling and length limit, but not the same random
stream: one seed gives other completions than stock TRL. With LoRA dropout active (training
mode, as in TRL's own generation and loss), one dropout draw covers a group's shared prompt
where stock TRL draws one per row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicLayer
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from trl import GRPOTrainer
from trl.models.utils import unwrap_model_for_generation

__all__ = [
    "ConductorGRPOTrainer",
    "FrozenStates",
    "first_trainable_layer",
    "gqa_attention",
    "group_rows",
    "grouped_completion_logps",
    "prompt_caches",
    "sample_tokens",
    "shared_prefill_generate",
]

# Prompts sharing fewer leading tokens are prefilled separately: one more forward call
# costs about as much as that many tokens.
MIN_SHARED_PREFIX = 16


class FastPathUnsupported(RuntimeError):
    """The model or the batch needs something the fast paths do not do; use TRL's path."""


# -- attention: SDPA without copying grouped key/value heads ----------------------------------

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
    Decoding with a ``grouped_decode`` cache goes to :func:`_grouped_decode_attention`."""
    decode = kwargs.get("grouped_decode")
    if decode is not None:
        layer = decode.layers[module.layer_idx]
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        return _grouped_decode_attention(query, layer, decode.spans, scale), None
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


AttentionInterface.register(GQA_ATTENTION, _sdpa_gqa_attention)
AttentionMaskInterface.register(GQA_ATTENTION, sdpa_mask)


def _base_model(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextlib.contextmanager
def gqa_attention(model: Any) -> Iterator[bool]:
    """Run an SDPA ``model`` with :func:`_sdpa_gqa_attention` while inside (the switch is on
    the model's config and undone on exit); yields whether it is active."""
    config = _base_model(model).config
    current = config._attn_implementation
    if current != "sdpa":
        yield current == GQA_ATTENTION
        return
    config._attn_implementation = GQA_ATTENTION
    try:
        yield True
    finally:
        config._attn_implementation = current


# -- the model's anatomy -------------------------------------------------------------------------

# Model types whose decoder layers this module calls one by one (transformers' Llama layout:
# embed_tokens, layers, rotary_emb, norm; a layer takes position_embeddings).
_LAYER_STACK_MODELS = ("llama",)


def _backbone_and_head(model: Any) -> tuple[Any, Any]:
    """The decoder stack (hidden states after the final norm) and the LM head. LoRA lives
    in the stack's modules, so calling it directly keeps the adapter (TRL's fused head
    calls it the same way)."""
    base = _base_model(model)
    return getattr(base, base.base_model_prefix), base.get_output_embeddings()


def first_trainable_layer(model: Any) -> int:
    """Index of the first decoder layer holding a trainable parameter, when the embeddings
    and every layer below it are frozen (LoRA on the last layers); 0 when nothing below a
    layer is frozen or the layer stack is not one this module drives."""
    base = _base_model(model)
    if getattr(base.config, "model_type", None) not in _LAYER_STACK_MODELS:
        return 0
    backbone, _ = _backbone_and_head(model)
    if any(p.requires_grad for p in backbone.embed_tokens.parameters()):
        return 0
    for index, layer in enumerate(backbone.layers):
        if any(p.requires_grad for p in layer.parameters()):
            return index
    return 0


def _causal_mask(queries: int, keys: int, rows: int, device: torch.device) -> torch.Tensor:
    """Boolean SDPA mask: the queries are the last ``queries`` of ``keys`` positions."""
    mask = torch.ones(queries, keys, dtype=torch.bool, device=device).tril(keys - queries)
    return mask.expand(rows, 1, queries, keys)


def _run_layers(
    backbone: Any,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    cache: Cache,
    first: int,
    mask: torch.Tensor,
) -> torch.Tensor:
    """The decoder layers from ``first`` on, then the final norm (Llama layout)."""
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


@contextlib.contextmanager
def _layer_inputs(backbone: Any, index: int | None) -> Iterator[list[torch.Tensor]]:
    """Collects the hidden states entering decoder layer ``index``, one tensor per call."""
    seen: list[torch.Tensor] = []
    if index is None:
        yield seen
        return

    def record(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        seen.append((args[0] if args else kwargs["hidden_states"]).detach())

    handle = backbone.layers[index].register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


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


# -- prompts and their caches -------------------------------------------------------------------

KV = list[tuple[torch.Tensor, torch.Tensor] | None]  # per decoder layer; None: not computed


def group_rows(prompts: Sequence[Sequence[int]]) -> list[tuple[list[int], list[int]]]:
    """Distinct prompts in order of first appearance, each with the rows that carry it."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, ids in enumerate(prompts):
        groups.setdefault(tuple(ids), []).append(row)
    return [(list(ids), rows) for ids, rows in groups.items()]


def _common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    first = prompts[0]
    length = min(len(p) for p in prompts)
    for i in range(length):
        token = first[i]
        if any(p[i] != token for p in prompts):
            return i
    return length


def _cache_from(kv: KV | None, rows: int = 1, n_layers: int = 0) -> Cache:
    """A transformers cache holding ``kv`` broadcast to ``rows`` rows without a copy (or an
    empty one of ``n_layers`` layers); layers without states stay empty."""
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


def _run_segment(
    model: Any,
    ids: Sequence[int],
    past: KV | None,
    start: int,
    frozen: torch.Tensor | None = None,
    first: int = 0,
) -> KV:
    """Keys and values of every layer after running ``ids`` (one row, positions from
    ``start``) after ``past``; from layer ``first`` on ``frozen`` states when given."""
    backbone, _ = _backbone_and_head(model)
    device = backbone.embed_tokens.weight.device
    positions = torch.arange(start, start + len(ids), device=device).unsqueeze(0)
    n_layers = backbone.config.num_hidden_layers
    if frozen is None:
        cache = backbone(
            input_ids=torch.tensor([list(ids)], device=device),
            position_ids=positions,
            past_key_values=_cache_from(past, n_layers=n_layers) if past else None,
            use_cache=True,
        ).past_key_values
    else:
        cache = _cache_from(past, n_layers=n_layers)
        mask = _causal_mask(len(ids), start + len(ids), 1, device)
        _run_layers(backbone, frozen.unsqueeze(0), positions, cache, first, mask)
    layers = cache.layers[first:]
    if any(type(layer) is not DynamicLayer for layer in layers):
        # sliding-window or linear-attention layers keep other state than keys and values
        raise FastPathUnsupported(f"cache layers {sorted({type(x).__name__ for x in layers})}")
    return [None] * first + [(layer.keys, layer.values) for layer in layers]


def prompt_caches(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    share_prefix: bool = True,
    frozen: FrozenStates | None = None,
    record: FrozenStates | None = None,
) -> list[KV | None]:
    """For each prompt, the keys and values of all its tokens but the last (the last one is
    the first input of decoding or scoring); ``None`` for a one-token prompt.

    With ``share_prefix`` the opening common to all prompts runs once and each prompt runs
    only its own tail on top of it. Gradients flow when enabled (the scoring pass).
    ``frozen``: start at its layer from its recorded states (layers below have no cache);
    ``record``: record the states entering its layer.
    """
    lengths = [len(p) - 1 for p in prompts]
    prefix = 0
    if share_prefix and len(prompts) > 1:
        prefix = min(_common_prefix(prompts), *lengths)
        prefix = prefix if prefix >= MIN_SHARED_PREFIX else 0
    first = frozen.layer if frozen is not None else 0
    backbone, _ = _backbone_and_head(model)

    def run(ids: Sequence[int], start: int, end: int, past: KV | None) -> KV:
        states = frozen.prompts[tuple(ids)][start:end] if frozen is not None else None
        return _run_segment(model, ids[start:end], past, start, states, first)

    caches: list[KV | None] = []
    with _layer_inputs(backbone, record.layer if record is not None else None) as seen:
        shared = run(prompts[0], 0, prefix, None) if prefix else None
        shared_states = seen[-1][0] if seen else None
        for ids, length in zip(prompts, lengths, strict=True):
            if length == prefix:
                caches.append(shared)
                states = shared_states
            else:
                caches.append(run(ids, prefix, length, shared))
                states = seen[-1][0] if seen else None
                if states is not None and shared_states is not None:
                    states = torch.cat([shared_states, states])
            if record is not None and states is not None:
                record.prompts[tuple(ids)] = states
    return caches


# -- generation ------------------------------------------------------------------------------


class _DecodeLayer(DynamicLayer):
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


def _spans(row_groups: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(group, first row, end row)`` of each run of rows of one group."""
    spans: list[tuple[int, int, int]] = []
    for row, group in enumerate(row_groups):
        if spans and spans[-1][0] == group:
            spans[-1] = (group, spans[-1][1], row + 1)
        else:
            spans.append((group, row, row + 1))
    return spans


class _GroupedDecodeCache(Cache):
    """The decode cache of rows sorted by prompt group; ``spans`` locates each group's
    rows among the live ones (see :func:`_grouped_decode_attention`)."""

    def __init__(self, caches: list[KV], row_groups: Sequence[int], width: int) -> None:
        n_layers = len(caches[0])
        super().__init__(
            layers=[
                _DecodeLayer([kv[i] for kv in caches], len(row_groups), width)
                for i in range(n_layers)
            ]
        )
        self.spans = _spans(row_groups)

    def keep(self, indices: torch.Tensor, row_groups: Sequence[int]) -> None:
        """Keep the rows at ``indices`` (unfinished ones), whose groups are ``row_groups``."""
        for layer in self.layers:
            layer.batch_select_indices(indices)
        self.spans = _spans(row_groups)


def _grouped_decode_attention(
    query: torch.Tensor, layer: _DecodeLayer, spans: list[tuple[int, int, int]], scaling: float
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


def sample_tokens(
    logits: torch.Tensor, warpers: LogitsProcessorList, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One token per row of ``logits`` (rows x vocabulary), from the distribution
    transformers samples from: the warpers, then softmax. Drawn by inverse CDF, which
    needs one uniform number per row where ``torch.multinomial`` draws one per token."""
    scores = warpers(None, logits) if warpers else logits
    probs = torch.softmax(scores, dim=-1)
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)
    total = cdf[:, -1:]
    uniform = torch.rand(total.shape, dtype=torch.float64, generator=generator, device=cdf.device)
    # strictly below the total, so the chosen token always has a positive probability
    draw = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, draw, right=True).squeeze(1)


def plain_warpers(temperature: float, top_p: float) -> LogitsProcessorList:
    """The warpers transformers builds for plain sampling (none at 1.0)."""
    warpers = LogitsProcessorList()
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    return warpers


def _head_logits(head: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head on a few rows. MKL computes ``W @ h.T`` for 8 rows of SmolLM2's 49k x 576
    head in about half the time of ``F.linear`` (the same dot products)."""
    if type(head) is not torch.nn.Linear:
        return head(hidden)
    logits = (head.weight @ hidden.T).T
    return logits if head.bias is None else logits + head.bias


@torch.no_grad()
def shared_prefill_generate(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    warpers: LogitsProcessorList | None = None,
    share_prefix: bool = True,
    generator: torch.Generator | None = None,
    record: FrozenStates | None = None,
) -> list[list[int]]:
    """Sampled completions, one per row of ``prompt_ids`` (rows may repeat a prompt).

    Each row's completion ends with its first EOS token (any of ``eos_token_ids``, kept) or
    after ``max_new_tokens`` tokens: the token lists TRL's ``_generate_single_turn`` returns.
    Each distinct prompt is prefilled once (see :func:`prompt_caches`); its rows then decode
    together on its cache (:class:`_GroupedDecodeCache`), and a finished row leaves the
    batch. ``record`` receives the states entering its layer.
    """
    if not prompt_ids or min(len(p) for p in prompt_ids) < 2:
        raise FastPathUnsupported("prompts of fewer than two tokens")
    backbone, head = _backbone_and_head(model)
    warpers = warpers if warpers is not None else LogitsProcessorList()
    groups = group_rows(prompt_ids)
    live = [row for _, rows in groups for row in rows]  # rows sorted by group
    live_groups = [index for index, (_, rows) in enumerate(groups) for _ in rows]
    completions: list[list[int]] = [[] for _ in prompt_ids]
    fed: list[list[torch.Tensor]] = [[] for _ in prompt_ids]
    with gqa_attention(model) as grouped_heads:
        if not grouped_heads:
            raise FastPathUnsupported(f"attention {_base_model(model).config._attn_implementation}")
        caches = prompt_caches(
            model, [ids for ids, _ in groups], share_prefix=share_prefix, record=record
        )
        cache = _GroupedDecodeCache(caches, live_groups, max_new_tokens)
        device = caches[0][0][0].device
        tokens = torch.tensor([[prompt_ids[row][-1]] for row in live], device=device)
        positions = torch.tensor([[len(prompt_ids[row]) - 1] for row in live], device=device)
        eos = torch.tensor(list(eos_token_ids), device=device)
        with _layer_inputs(backbone, record.layer if record is not None else None) as seen:
            for _ in range(max_new_tokens):
                hidden = backbone(
                    input_ids=tokens,
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                    grouped_decode=cache,
                ).last_hidden_state[:, -1]
                chosen = sample_tokens(_head_logits(head, hidden).float(), warpers, generator)
                states = seen.pop() if seen else None
                for i, (row, token) in enumerate(zip(live, chosen.tolist(), strict=True)):
                    completions[row].append(token)
                    if states is not None:
                        fed[row].append(states[i, 0])
                done = torch.isin(chosen, eos)
                if bool(done.all()):
                    break
                if bool(done.any()):
                    keep = (~done).nonzero().squeeze(1)
                    live = [live[i] for i in keep.tolist()]
                    live_groups = [live_groups[i] for i in keep.tolist()]
                    cache.keep(keep, live_groups)
                    chosen, positions = chosen[keep], positions[keep]
                tokens = chosen.unsqueeze(1)
                positions = positions + 1
    if record is not None:
        for ids, completion, states in zip(prompt_ids, completions, fed, strict=True):
            record.rollouts[(tuple(ids), tuple(completion))] = torch.stack(states)
    return completions


# -- scoring ---------------------------------------------------------------------------------


def _token_logps(
    logits: torch.Tensor,
    targets: torch.Tensor,
    compute_entropy: bool,
    entropy_requires_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    log_probs = logits.log_softmax(dim=-1)
    logps = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not compute_entropy:
        return logps, None
    with torch.set_grad_enabled(entropy_requires_grad and torch.is_grad_enabled()):
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logps, entropy


def _usable_states(
    frozen: FrozenStates | None,
    model: Any,
    prompts: list[list[int]],
    completions: list[tuple[int, ...]],
) -> FrozenStates | None:
    """``frozen`` when it holds the states of every row of this batch for this model."""
    if frozen is None or frozen.backbone is not _backbone_and_head(model)[0]:
        return None
    if first_trainable_layer(model) != frozen.layer:
        return None
    rows = zip(prompts, completions, strict=True)
    if any((tuple(p), c) not in frozen.rollouts for p, c in rows):
        return None
    if any(len(p) > 1 and tuple(p) not in frozen.prompts for p in prompts):
        return None
    return frozen


def grouped_completion_logps(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    entropy_requires_grad: bool = False,
    batch_size: int | None = None,
    share_prefix: bool = True,
    frozen: FrozenStates | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities (and entropies) of the completion tokens, as TRL's
    ``_get_per_token_logps_and_entropies`` returns them: ``(rows, logits_to_keep)``, zero
    where ``attention_mask`` is 0.

    ``input_ids`` is TRL's layout: left-padded prompts, then right-padded completions of
    width ``logits_to_keep``. Rows are grouped by prompt (in any order); each prompt runs
    once and its cache serves its rows, ``batch_size`` rows at a time (``None``: all).
    When ``frozen`` holds every row (the rollouts it recorded), the layers below its layer
    are not run again.
    """
    rows_total, split = input_ids.size(0), input_ids.size(1) - logits_to_keep
    device = input_ids.device
    prompt_mask = attention_mask[:, :split].bool()
    completion_ids = input_ids[:, split:]
    completion_mask = attention_mask[:, split:].bool()
    prompts = [
        row[keep].tolist() for row, keep in zip(input_ids[:, :split], prompt_mask, strict=True)
    ]
    if min(len(p) for p in prompts) < 1:
        raise FastPathUnsupported("a row without prompt tokens")
    completions = [
        tuple(row[keep].tolist()) for row, keep in zip(completion_ids, completion_mask, strict=True)
    ]
    backbone, head = _backbone_and_head(model)
    groups = group_rows(prompts)

    order: list[int] = []
    logps_parts: list[torch.Tensor] = []
    entropy_parts: list[torch.Tensor] = []
    with gqa_attention(model) as grouped_heads:
        frozen = _usable_states(frozen, model, prompts, completions) if grouped_heads else None
        if frozen is not None:
            frozen.uses += 1
        caches = prompt_caches(
            model, [ids for ids, _ in groups], share_prefix=share_prefix, frozen=frozen
        )
        for (ids, group), kv in zip(groups, caches, strict=True):
            step = batch_size or len(group)
            for start in range(0, len(group), step):
                rows = group[start : start + step]
                index = torch.tensor(rows, device=device)
                targets, valid = completion_ids[index], completion_mask[index]
                # the columns up to the last real token (one at least keeps the graph connected)
                used = int(valid.any(0).nonzero().max()) + 1 if bool(valid.any()) else 1
                past = len(ids) - 1
                positions = torch.arange(past, past + used, device=device)
                positions = positions.unsqueeze(0).expand(len(rows), -1)
                cache = _cache_from(kv, len(rows), backbone.config.num_hidden_layers)
                if frozen is None:
                    first = input_ids.new_full((len(rows), 1), ids[-1])
                    hidden = backbone(
                        input_ids=torch.cat([first, targets[:, : used - 1]], dim=1),
                        position_ids=positions,
                        past_key_values=cache if kv is not None else None,
                        use_cache=True,
                    ).last_hidden_state
                else:
                    states = [frozen.rollouts[(tuple(ids), completions[r])] for r in rows]
                    inputs = states[0].new_zeros((len(rows), used, states[0].shape[-1]))
                    for i, row_states in enumerate(states):
                        inputs[i, : len(row_states)] = row_states[:used]
                    mask = _causal_mask(used, past + used, len(rows), device)
                    hidden = _run_layers(backbone, inputs, positions, cache, frozen.layer, mask)
                scored = valid[:, :used]
                logits = head(hidden[scored]).float() / temperature
                logps, entropy = _token_logps(
                    logits, targets[:, :used][scored], compute_entropy, entropy_requires_grad
                )
                full = torch.zeros_like(valid)
                full[:, :used] = scored
                logps_parts.append(logps.new_zeros(valid.shape).masked_scatter(full, logps))
                if entropy is not None:
                    entropy_parts.append(
                        entropy.new_zeros(valid.shape).masked_scatter(full, entropy)
                    )
                order.extend(rows)
    # back to the caller's row order
    inverse = torch.empty(rows_total, dtype=torch.long, device=device)
    inverse[torch.tensor(order, device=device)] = torch.arange(rows_total, device=device)
    logps = torch.cat(logps_parts)[inverse]
    entropies = torch.cat(entropy_parts)[inverse] if compute_entropy else None
    return logps, entropies


# -- the trainer -----------------------------------------------------------------------------

# Head settings TRL's fused LM head applies and the grouped scoring does not.
_HEAD_SCALES = (
    "final_logit_softcapping",
    "logit_scale",
    "output_multiplier",
    "lm_head_multiplier",
    "logits_scaling",
)


class ConductorGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with the CPU fast paths of this module: shared-prefill generation
    (``_generate_single_turn``) and grouped scoring (``_get_per_token_logps_and_entropies``).

    Each path checks that it applies and otherwise calls TRL's method: GPU, vLLM,
    several processes, multimodal inputs, tools, gradient checkpointing, MoE auxiliary
    losses, or sampling beyond temperature and top-p all run exactly as in TRL.
    ``fast_path_calls`` counts the calls each fast path served.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fast_path_calls = {"generation": 0, "scoring": 0}
        self._frozen_states: FrozenStates | None = None  # from the last generation

    def _cpu_blocker(self) -> str | None:
        """Why the fast paths cannot run here, or ``None``."""
        if self.accelerator.device.type != "cpu":
            return "not on CPU"
        if self.accelerator.num_processes != 1:
            return "several processes"  # the unwrapped model would bypass gradient sync
        if self.use_vllm or getattr(self, "use_transformers_continuous_batching", False):
            return "vLLM or continuous batching"
        if self._is_vlm or self.tools:
            return "multimodal model or tools"
        return None

    # -- generation --

    def _sampling_warpers(self, model: Any) -> LogitsProcessorList | None:
        """The warpers transformers would apply to TRL's generation config, when they are
        plain temperature/top-p ones and decoding stops only at EOS or the length limit."""
        try:
            config, _ = model._prepare_generation_config(self.generation_config)
            processors = model._get_logits_processor(generation_config=config)
        except (AttributeError, TypeError, ValueError):
            return None  # another transformers than the one this was written against
        if not config.do_sample or (config.num_beams or 1) != 1:
            return None
        if config.stop_strings or config.max_time or config.max_new_tokens is None:
            return None
        if any(type(p) not in (TemperatureLogitsWarper, TopPLogitsWarper) for p in processors):
            return None
        return plain_warpers(config.temperature or 1.0, config.top_p or 1.0)

    def _generate_single_turn(
        self,
        prompt_ids: list[list[int]],
        images: Any,
        multimodal_fields: Any,
        num_generations: int,
        has_tool_images: bool = False,
    ) -> tuple[list[list[int]], None]:
        plain = images is None and not multimodal_fields and not has_tool_images
        if plain and self._cpu_blocker() is None:
            completions = self._shared_prefill_completions(prompt_ids)
            if completions is not None:
                self.fast_path_calls["generation"] += 1
                return completions, None
        return super()._generate_single_turn(
            prompt_ids, images, multimodal_fields, num_generations, has_tool_images
        )

    def _shared_prefill_completions(self, prompt_ids: list[list[int]]) -> list[list[int]] | None:
        with (
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                generation_kwargs=self.generation_kwargs,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as model,
            torch.no_grad(),
        ):
            warpers = self._sampling_warpers(model)
            if warpers is None:
                return None
            first = first_trainable_layer(model)
            record = FrozenStates(_backbone_and_head(model)[0], first) if first else None
            self._frozen_states = None
            try:
                completions = shared_prefill_generate(
                    model,
                    prompt_ids,
                    max_new_tokens=self.max_completion_length,
                    eos_token_ids=self.eos_token_ids,
                    warpers=warpers,
                    record=record,
                )
            except FastPathUnsupported:
                return None
            self._frozen_states = record
            return completions

    # -- scoring --

    def _scoring_blocker(self, model: Any) -> str | None:
        blocker = self._cpu_blocker()
        if blocker is not None:
            return blocker
        if self.args.gradient_checkpointing:
            return "gradient checkpointing"  # checkpointed layers drop the prompt cache
        if self.args.cast_lm_head_to_fp32:
            return "fp32 LM head"
        text_config = _base_model(model).config.get_text_config()
        if any(getattr(text_config, name, None) is not None for name in _HEAD_SCALES):
            return "scaled or soft-capped logits"
        return None

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **extra: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        unwrapped = self.accelerator.unwrap_model(model)
        if (
            not compute_aux_loss
            and all(value is None for value in extra.values())
            and self._scoring_blocker(unwrapped) is None
        ):
            try:
                with self.accelerator.autocast():
                    logps, entropies = grouped_completion_logps(
                        unwrapped,
                        input_ids,
                        attention_mask,
                        logits_to_keep,
                        temperature=self.temperature,
                        compute_entropy=compute_entropy,
                        entropy_requires_grad=bool(self._entropy_bonus_enabled),
                        batch_size=batch_size,
                        frozen=self._frozen_states,
                    )
                self.fast_path_calls["scoring"] += 1
                return logps, entropies, None
            except FastPathUnsupported:
                pass
        return super()._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=batch_size,
            compute_entropy=compute_entropy,
            compute_aux_loss=compute_aux_loss,
            **extra,
        )
