"""Training the Conductor: reward = execute the workflow and verify; SFT warm start; GRPO.

Light imports only here (no torch/TRL): the reward and the configuration are usable from a
notebook without loading a model. The training run lives in ``training.grpo``
(``train_conductor``; its parts in the modules it names) and the warm start in
``training.sft``; import them explicitly.
"""

from conductor_pipeline.training.configs import (
    RewardConfig,
    TrainingConfig,
    TrainingConfigError,
)
from conductor_pipeline.training.planner import ReferencePlanner
from conductor_pipeline.training.rewards import ConductorReward
from conductor_pipeline.training.rollout_stats import RolloutStats
from conductor_pipeline.training.scoring import RolloutScore, score_rollout

__all__ = [
    "ConductorReward",
    "ReferencePlanner",
    "RewardConfig",
    "RolloutScore",
    "RolloutStats",
    "TrainingConfig",
    "TrainingConfigError",
    "score_rollout",
]
