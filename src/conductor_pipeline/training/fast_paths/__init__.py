"""The CPU scoring path of :class:`~conductor_pipeline.training.trainer.ConductorGRPOTrainer`
(why and what it changes: that module's docstring).

Attention and the cache layers are the generation engine's
(:mod:`conductor_pipeline.generation`). ``layers``: the decoder parts driven directly and
the states recorded at the first trainable layer; ``prefill``: prompt caches; ``scoring``:
grouped log-probabilities.
"""

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
]
