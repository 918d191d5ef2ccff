"""The CPU fast paths of :class:`~conductor_pipeline.training.trainer.ConductorGRPOTrainer`
(why and what they change: that module's docstring).

Attention, the decode cache and the token draw are the generation engine's
(:mod:`conductor_pipeline.generation`). ``layers``: the decoder parts driven directly; ``prefill``: prompt caches; ``decode``: shared-prefill generation;
``scoring``: grouped log-probabilities.
"""

from conductor_pipeline.training.fast_paths.decode import shared_prefill_generate
from conductor_pipeline.training.fast_paths.layers import (
    FastPathUnsupported,
    FrozenStates,
    first_trainable_layer,
)
from conductor_pipeline.training.fast_paths.prefill import group_rows, prompt_caches
from conductor_pipeline.training.fast_paths.scoring import grouped_completion_logps

__all__ = [
    "FastPathUnsupported",
    "FrozenStates",
    "first_trainable_layer",
    "group_rows",
    "grouped_completion_logps",
    "prompt_caches",
    "shared_prefill_generate",
]
