"""The CPU fast paths of :class:`~conductor_pipeline.training.trainer.ConductorGRPOTrainer`
(why and what they change: that module's docstring).

``attention``: SDPA with broadcast grouped key/value heads; ``layers``: the decoder parts
driven directly; ``prefill``: prompt caches; ``decode``: shared-prefill generation;
``scoring``: grouped log-probabilities.
"""

from conductor_pipeline.training.fast_paths.attention import GQA_ATTENTION, gqa_attention
from conductor_pipeline.training.fast_paths.decode import shared_prefill_generate
from conductor_pipeline.training.fast_paths.layers import (
    FastPathUnsupported,
    FrozenStates,
    first_trainable_layer,
)
from conductor_pipeline.training.fast_paths.prefill import group_rows, prompt_caches
from conductor_pipeline.training.fast_paths.scoring import grouped_completion_logps

__all__ = [
    "GQA_ATTENTION",
    "FastPathUnsupported",
    "FrozenStates",
    "first_trainable_layer",
    "gqa_attention",
    "group_rows",
    "grouped_completion_logps",
    "prompt_caches",
    "shared_prefill_generate",
]
