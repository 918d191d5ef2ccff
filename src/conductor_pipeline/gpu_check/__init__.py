"""``make gpu-check``: GRPO steps at the GPU profile's real shapes on one CUDA GPU, to tell
whether a training run fits the GPU's memory and how long it takes.

What it runs, by default at the shapes of ``conf/gpu/parameters_training.yml`` (the base
model, 4096-token prompts, 1024-token completions, groups of 64, micro-batches of 8, LoRA
r 64 / alpha 128 on every projection, bf16, gradient checkpointing, colocated vLLM at its
memory share): a warm-up and timed GRPO steps through the project's
``ConductorGRPOTrainer`` (TRL's ``GRPOTrainer`` where the project's training package does
not import), every completion run to full length, rewarded by a checksum of its tokens.
One question per step by default; the step time is projected to the profile's
``prompts_per_step`` and ``max_steps``. The JSON's ``verdict`` says ``fits_memory``,
``step_s``, ``projected_step_s``, ``projected_run_h`` and what was and was not checked.

Never a silent pass. Exit codes: 0 every required part ran (and fits), 1 a section failed
or computed a non-finite loss or gradient norm or timed no step, 2 no CUDA, 3 the budget
ran out (a watchdog writes the JSON), 4 a required part was skipped (TRL not importable;
vLLM not importable while the profile generates with it; the weights are not on this
machine), 5 the run would not fit the GPU's memory. ``--no-trl`` and ``--no-vllm`` make
those parts optional; ``--device cpu`` exists for the unit tests only.

The worker pool, API keys, datasets and several processes (NCCL) are the preflight's.

The modules, in the order a run uses them: ``report`` (the JSON and the budget),
``profile`` (the shapes the profile trains at), ``options`` (arguments, what runs),
``environment`` (versions, timing and memory helpers), ``model`` (weights, LoRA, prompts),
``generation`` and ``grpo`` (the measurements), ``verdict`` (fits, projections) and
``runner`` (sections, exit code).
"""

from conductor_pipeline.gpu_check.environment import (
    GIB,
    DeviceMemorySampler,
    describe_environment,
    module_version,
    package_version,
    peak_memory,
    synchronize,
)
from conductor_pipeline.gpu_check.generation import measure_generation
from conductor_pipeline.gpu_check.grpo import (
    completion_mask,
    run_self_contained_grpo,
    run_trl_grpo,
    self_contained_grpo_step,
    synthetic_reward,
    synthetic_rewards,
    trl_trainer_class,
)
from conductor_pipeline.gpu_check.model import (
    KNOWN_ARCHITECTURES,
    QWEN2_5_7B_INSTRUCT_CONFIG,
    SMOLLM2_135M_CONFIG,
    ModelSource,
    ModelUnavailable,
    build_random_model,
    count_parameters,
    load_policy,
    load_tokenizer,
    lora_config,
    materialise_model,
    prompt_texts,
    prompt_token_ids,
    resolve_model_source,
)
from conductor_pipeline.gpu_check.options import Parts, choose_parts, parse_args, run_shape
from conductor_pipeline.gpu_check.profile import LoraShape, ProfileShapes, RunShape, load_profile
from conductor_pipeline.gpu_check.report import (
    DEFAULT_BUDGET_S,
    DEFAULT_OUTPUT,
    EXIT_DOES_NOT_FIT,
    EXIT_FAILED,
    EXIT_INCOMPLETE,
    EXIT_NO_CUDA,
    EXIT_OK,
    EXIT_TIMEOUT,
    Budget,
    Report,
    compact_json,
)
from conductor_pipeline.gpu_check.runner import check, main, run_section
from conductor_pipeline.gpu_check.verdict import memory_verdict, step_problems, time_verdict

__all__ = [
    "DEFAULT_BUDGET_S",
    "DEFAULT_OUTPUT",
    "EXIT_DOES_NOT_FIT",
    "EXIT_FAILED",
    "EXIT_INCOMPLETE",
    "EXIT_NO_CUDA",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "GIB",
    "KNOWN_ARCHITECTURES",
    "QWEN2_5_7B_INSTRUCT_CONFIG",
    "SMOLLM2_135M_CONFIG",
    "Budget",
    "DeviceMemorySampler",
    "LoraShape",
    "ModelSource",
    "ModelUnavailable",
    "Parts",
    "ProfileShapes",
    "Report",
    "RunShape",
    "build_random_model",
    "check",
    "choose_parts",
    "compact_json",
    "completion_mask",
    "count_parameters",
    "describe_environment",
    "load_policy",
    "load_profile",
    "load_tokenizer",
    "lora_config",
    "main",
    "materialise_model",
    "measure_generation",
    "memory_verdict",
    "module_version",
    "package_version",
    "parse_args",
    "peak_memory",
    "prompt_texts",
    "prompt_token_ids",
    "resolve_model_source",
    "run_section",
    "run_self_contained_grpo",
    "run_shape",
    "run_trl_grpo",
    "self_contained_grpo_step",
    "step_problems",
    "synchronize",
    "synthetic_reward",
    "synthetic_rewards",
    "time_verdict",
    "trl_trainer_class",
]
