"""The training report's content, reached by the notebook as ``tr.<name>``: curves from the
MLflow metric history of the training run (or the saved history table), worker usage over
training, what the Conductor learns per domain, cost per rollout, the warm start's loss,
the warm start check at GRPO step 1 and the multi-step attempts with the reward they earn.

The pieces live in :mod:`.training_history` (reading the metrics), :mod:`.training_curves`
(the curves), :mod:`.training_routing` (per domain), :mod:`.training_multistep` (warm start
check, multi-step attempts) and :mod:`.training_files` (overview, sample rollouts); the
opening paragraph is written in :mod:`.headlines`.
"""

from conductor_pipeline.reporting.display import MissingInput  # noqa: F401  (re-exported)
from conductor_pipeline.reporting.training_curves import (  # noqa: F401  (re-exported)
    REWARD_RANGE,
    cost_figure,
    parse_rate_figure,
    reward_figure,
    sft_loss,
    sft_loss_figure,
    worker_usage,
    worker_usage_figure,
)
from conductor_pipeline.reporting.training_files import (  # noqa: F401  (re-exported)
    overview_table,
    read_adapter_info,
    resolve_rollout_samples,
    rollout_examples,
)
from conductor_pipeline.reporting.training_history import (  # noqa: F401  (re-exported)
    STAGES,
    default_sft_history,
    describe_history,
    load_history,
    metric_history_from_mlflow,
    stage_series,
    stage_steps,
    start_end_table,
    worker_label,
)
from conductor_pipeline.reporting.training_multistep import (  # noqa: F401  (re-exported)
    MULTI_STEP_METRICS,
    OLDER_RUN,
    WARM_START_STEP,
    WARM_START_TARGETS,
    multi_step_figure,
    warm_start_check,
    warm_start_section,
)
from conductor_pipeline.reporting.training_routing import (  # noqa: F401  (re-exported)
    answer_workers_by_domain,
    routing_figure,
    shape_history,
)
