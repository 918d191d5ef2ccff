"""Training parameters as validated dataclasses, read from ``conf/*/parameters_training.yml``.

``TrainingConfig.from_params(params["training"])`` builds the whole tree and raises
:class:`TrainingConfigError` naming the offending key (``training.grpo.lerning_rate: unknown
key ...``) before any model is loaded. Nothing here imports torch, TRL, Kedro or MLflow at
import time; ``training.trainer_args`` (``grpo_args``, ``lora_config``) turns a config into
TRL's ``GRPOConfig`` and PEFT's ``LoraConfig`` and imports those libraries when called, and
``training.config_builder`` checks each key and value of the mapping.

Layout of the ``training`` mapping (every key optional; defaults are the sandbox values)::

    base_model, seed, max_train_tasks, max_prompt_tokens, output_dir, resume
    grpo:      group size (num_generations), prompts_per_step, learning rate, steps, ...
    lora:      enabled, r, alpha, dropout, target_modules
    reward:    the 0 / 0.5 / 1 values, the optional cost term, infra-failure retries
    sft:       the scripted warm start (on in the sandbox, off at full scale)
    recursion: the optional recursion fine-tune stage
    budget:    hard per-rollout limits on worker steps, tokens and dollars
    caps:      when a run stops by itself: masked-rollout rate, total worker dollars

The prompt is not here: training writes its prompts from ``conductor.prompt``
(``conf/*/parameters_conductor.yml``), the same settings evaluation, serving and
``conductor ask`` use, so the Conductor is trained on the prompt it is later served with.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from conductor_pipeline.hashing import content_hash
from conductor_pipeline.training.config_builder import build_dataclass

__all__ = [
    "FULL_FINETUNE_LR",
    "SMOLLM2",
    "BudgetSettings",
    "CapsSettings",
    "CurriculumSettings",
    "GRPOSettings",
    "LoraSettings",
    "RecursionSettings",
    "RewardConfig",
    "SFTSettings",
    "TrainingConfig",
    "TrainingConfigError",
]

# ``base_model`` value meaning "the offline SmolLM2 copy made by workers.local_model".
SMOLLM2 = "smollm2-135m-instruct"

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
SFT_SHAPES = ("single", "solve_check", "parallel_aggregate")
SFT_ROUTING = ("random", "domain_table")
SFT_SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup")
SCALE_REWARDS = ("group", "batch", "none")
VLLM_MODES = ("colocate", "server")
COST_UNITS = ("usd", "tokens")
# The paper's learning rate for its full fine-tune of the 7B Conductor (conductor-paper.md §4).
# A LoRA run at or below it barely moves the adapter, so the loader refuses that pairing.
FULL_FINETUNE_LR = 1e-6


class TrainingConfigError(ValueError):
    """The training configuration is invalid; the message starts with the key's path."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True)
class GRPOSettings:
    """GRPO proper. One optimizer step draws ``prompts_per_step`` questions and
    ``num_generations`` completions for each (the group the advantage is computed over).

    ``micro_batch_size``: completions per forward/backward pass per device (``None``: the
    whole step at once); gradient accumulation covers the rest. ``num_iterations``: updates
    per generated batch (TRL's; the paper's 1; more reuse each batch of rollouts, with the
    clipped importance ratio keeping the updates close). ``balanced_domains``: the
    questions of a step span the task domains (the prompts in turn by domain, not shuffled;
    :func:`~conductor_pipeline.training.inputs.interleave_domains`). ``loss_type`` is TRL's:
    ``dapo`` (TRL default: token-level, normalised over the whole generation batch) or
    ``bnpo`` (the authors' code: token-level, normalised per micro-batch).
    ``entropy_coef``: TRL's entropy bonus (the mean per-token entropy, times this, taken
    off the loss; 0: none), which keeps a policy from settling early on one choice.
    """

    num_generations: int = 4
    prompts_per_step: int = 2
    micro_batch_size: int | None = None
    max_steps: int = 24
    learning_rate: float = 2e-5
    max_completion_length: int = 160
    temperature: float = 1.0
    top_p: float = 1.0
    loss_type: str = "dapo"
    beta: float = 0.0
    epsilon: float = 0.2
    entropy_coef: float = 0.0
    num_iterations: int = 1
    balanced_domains: bool = False
    scale_rewards: str = "group"
    lr_scheduler_type: str = "cosine"
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    save_steps: int = 4
    save_total_limit: int | None = 2
    bf16: bool | str = False
    gradient_checkpointing: bool = False
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    vllm_gpu_memory_utilization: float = 0.3
    vllm_server_base_url: str | None = None
    model_dtype: str | None = None

    def __post_init__(self) -> None:
        _check(self.num_generations >= 2, "num_generations must be at least 2 (GRPO needs a group)")
        _check(self.prompts_per_step >= 1, "prompts_per_step must be at least 1")
        _check(self.max_steps >= 1, "max_steps must be at least 1")
        _check(self.learning_rate > 0, "learning_rate must be positive")
        _check(self.max_completion_length >= 8, "max_completion_length must be at least 8")
        _check(self.temperature > 0, "temperature must be positive")
        _check(0 < self.top_p <= 1, "top_p must be in (0, 1]")
        _check(self.loss_type in LOSS_TYPES, f"loss_type must be one of {LOSS_TYPES}")
        _check(self.beta >= 0, "beta must be >= 0")
        _check(self.epsilon > 0, "epsilon must be positive")
        _check(self.entropy_coef >= 0, "entropy_coef must be >= 0")
        _check(self.num_iterations >= 1, "num_iterations must be at least 1")
        _check(
            self.bf16 in (True, False, "auto"),
            f"bf16 must be true, false or auto, got {self.bf16!r}",
        )
        _check(self.scale_rewards in SCALE_REWARDS, f"scale_rewards must be one of {SCALE_REWARDS}")
        _check(0 <= self.warmup_ratio < 1, "warmup_ratio must be in [0, 1)")
        _check(self.save_steps >= 1, "save_steps must be at least 1")
        _check(self.vllm_mode in VLLM_MODES, f"vllm_mode must be one of {VLLM_MODES}")
        _check(
            0 < self.vllm_gpu_memory_utilization <= 1,
            "vllm_gpu_memory_utilization must be in (0, 1]",
        )
        _check(
            self.model_dtype in (None, "float32", "bfloat16", "float16", "auto"),
            "model_dtype must be null, float32, bfloat16, float16 or auto",
        )
        if self.micro_batch_size is not None:
            _check(self.micro_batch_size >= 1, "micro_batch_size must be at least 1")
            _check(
                self.batch_size % self.micro_batch_size == 0,
                f"micro_batch_size ({self.micro_batch_size}) must divide prompts_per_step * "
                f"num_generations ({self.batch_size})",
            )

    @property
    def batch_size(self) -> int:
        """Completions per optimizer step."""
        return self.prompts_per_step * self.num_generations


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapter shape. ``enabled: false`` trains the full model (the paper's choice).

    ``last_layers``: put adapters only on the last N decoder layers (null: all layers).
    Backpropagation then stops at the lowest adapted layer, which cut the backward pass
    of a SmolLM2 GRPO step on CPU about threefold (8 of 30 layers).
    """

    enabled: bool = True
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    last_layers: int | None = None

    def __post_init__(self) -> None:
        if self.last_layers is not None:
            _check(self.last_layers >= 1, "last_layers must be at least 1 or null")
        _check(self.r >= 1, "r must be at least 1")
        _check(self.alpha >= 1, "alpha must be at least 1")
        _check(0 <= self.dropout < 1, "dropout must be in [0, 1)")
        _check(bool(self.target_modules), "target_modules must not be empty")


@dataclass(frozen=True)
class RewardConfig:
    """How a rollout is scored.

    Paper reward: ``unparseable`` (0) when the completion is not a workflow, ``wrong`` (0.5)
    when it parses but the final answer is wrong, ``correct`` (1) when it is right. With
    ``partial_credit`` a verifier's fractional score (code tests passed) interpolates
    between ``wrong`` and ``correct``.

    Optional cost term (off when ``cost_weight`` is 0): ``reward -= cost_weight * cost``,
    cost in dollars (``cost_unit: usd``) or thousands of worker tokens (``tokens``), priced
    at list price even for cache hits so that a cached answer is not "free".

    Infrastructure failures are retried ``infra_retries`` times (``retry_delay_s`` doubling
    each time) and then masked. ``retry_on_any_failure`` also retries when an intermediate
    step failed but the answer step still answered. ``max_concurrency`` bounds the rollouts
    executing at once across the whole batch.
    """

    correct: float = 1.0
    wrong: float = 0.5
    unparseable: float = 0.0
    partial_credit: bool = False
    cost_weight: float = 0.0
    cost_unit: str = "usd"
    infra_retries: int = 2
    retry_delay_s: float = 0.5
    retry_on_any_failure: bool = False
    max_concurrency: int = 16

    def __post_init__(self) -> None:
        _check(self.cost_unit in COST_UNITS, f"cost_unit must be one of {COST_UNITS}")
        _check(self.cost_weight >= 0, "cost_weight must be >= 0")
        _check(self.infra_retries >= 0, "infra_retries must be >= 0")
        _check(self.retry_delay_s >= 0, "retry_delay_s must be >= 0")
        _check(self.max_concurrency >= 1, "max_concurrency must be at least 1")


@dataclass(frozen=True)
class SFTSettings:
    """The scripted warm start (see ``training.planner``): ``n_examples`` planner workflows
    for train questions, ``max_steps`` SFT optimizer steps with completion-only loss.

    It teaches the reply format and workflow shapes, not routing. ``shapes`` weighs the
    shapes the examples take (``single``, ``solve_check``, ``parallel_aggregate``);
    ``max_parallel_attempts``: a ``parallel_aggregate`` example has 2 to this many attempts
    before its aggregator; ``subtask_wordings``: how many of the planner's wordings per role
    (solve, check, aggregate) the examples draw from. With
    ``routing: random`` (the default) every worker in every example is drawn at random, so
    which worker suits which question is left to reward. ``routing: domain_table`` is the
    older rule, kept for comparison only: the solver is ``domain_workers[task.domain]``
    (``default_worker`` for other domains) and checks go to ``verifier_worker``; names
    missing from the pool fall back to worker 0. ``lr_scheduler_type`` is a transformers
    scheduler name. ``grouped_batches``: batches of examples of similar length (in random
    order among themselves), padding a fifth fewer tokens than plain random batches; at a
    constant rate the last grouped batches decided which shapes the warm start wrote, so
    keep it with a decaying schedule. ``model_id_last``: the examples write the worker ids
    after the subtasks and the access list, so that their count follows the shape already
    written (docs/measurements.md, "The warm start at GRPO step 1"). ``distinct_checker``:
    the worker that checks a single attempt is never its solver; ``distinct_aggregator``: the
    worker that aggregates parallel attempts is never one of their solvers.
    ``attempts_in_pool_order``: the parallel attempts are written in the pool's order (their
    order changes nothing they compute), so a set of solvers has one spelling, not one per
    permutation, and no solver follows itself.
    """

    enabled: bool = True
    n_examples: int = 48
    max_steps: int = 30
    batch_size: int = 4
    learning_rate: float = 2e-3
    lr_scheduler_type: str = "linear"
    grouped_batches: bool = True
    max_length: int = 1280
    routing: str = "random"
    shapes: Mapping[str, float] = field(
        default_factory=lambda: {"single": 0.25, "solve_check": 0.4, "parallel_aggregate": 0.35}
    )
    max_parallel_attempts: int = 2
    subtask_wordings: int = 1
    model_id_last: bool = False
    distinct_checker: bool = True
    distinct_aggregator: bool = True
    attempts_in_pool_order: bool = False
    domain_workers: Mapping[str, str] = field(default_factory=dict)
    default_worker: str = "sim-sage"
    verifier_worker: str = "sim-sage"

    def __post_init__(self) -> None:
        _check(self.n_examples >= 1, "n_examples must be at least 1")
        _check(self.max_steps >= 1, "max_steps must be at least 1")
        _check(self.batch_size >= 1, "batch_size must be at least 1")
        _check(self.learning_rate > 0, "learning_rate must be positive")
        _check(
            self.lr_scheduler_type in SFT_SCHEDULERS,
            f"lr_scheduler_type must be one of {SFT_SCHEDULERS}",
        )
        _check(self.max_length >= 64, "max_length must be at least 64")
        _check(self.routing in SFT_ROUTING, f"routing must be one of {SFT_ROUTING}")
        _check(self.max_parallel_attempts >= 2, "max_parallel_attempts must be at least 2")
        _check(self.subtask_wordings >= 1, "subtask_wordings must be at least 1")
        unknown = sorted(set(self.shapes) - set(SFT_SHAPES))
        _check(not unknown, f"shapes: unknown shape(s) {unknown}; known: {SFT_SHAPES}")
        _check(
            all(w >= 0 for w in self.shapes.values()) and sum(self.shapes.values()) > 0,
            "shapes: weights must be >= 0 and not all 0",
        )
        object.__setattr__(self, "shapes", dict(self.shapes))
        object.__setattr__(self, "domain_workers", dict(self.domain_workers))


@dataclass(frozen=True)
class RecursionSettings:
    """The recursion fine-tune (paper §3): after the main GRPO run, ``max_steps`` more steps
    in which ``share`` of each group also gets a forced recursion round; the round-0 reward
    becomes ``(1 - discount) * r0 + discount * r1``."""

    enabled: bool = False
    share: float = 0.5
    discount: float = 0.25
    max_steps: int = 10

    def __post_init__(self) -> None:
        _check(0 < self.share <= 1, "share must be in (0, 1]")
        _check(0 <= self.discount <= 1, "discount must be in [0, 1]")
        _check(self.max_steps >= 1, "max_steps must be at least 1")


@dataclass(frozen=True)
class CurriculumSettings:
    """Which questions the GRPO steps draw (``training.curriculum``). ``reference_worker``:
    a worker of the pool asked every training question once, alone, before GRPO (null: no
    pre-pass, the steps take the questions as ``grpo.balanced_domains`` orders them);
    ``unsolved_share``: the share of each step's questions drawn from those it got wrong
    (:mod:`~conductor_pipeline.training.curriculum`); ``final_unsolved_share``: the share
    at the last step (``grpo.max_steps``), reached in a straight line from
    ``unsolved_share`` at the first (null: the same share at every step)."""

    reference_worker: str | None = None
    unsolved_share: float = 0.5
    final_unsolved_share: float | None = None

    def __post_init__(self) -> None:
        _check(0 <= self.unsolved_share <= 1, "unsolved_share must be in [0, 1]")
        final = self.final_unsolved_share
        _check(final is None or 0 <= final <= 1, "final_unsolved_share must be in [0, 1]")

    def share_at(self, step: int, steps: int) -> float:
        """The unsolved share of step ``step`` (0-based) of ``steps``."""
        if self.final_unsolved_share is None or steps < 2:
            return self.unsolved_share
        progress = min(step, steps - 1) / (steps - 1)
        return self.unsolved_share + (self.final_unsolved_share - self.unsolved_share) * progress


@dataclass(frozen=True)
class BudgetSettings:
    """Hard limits per executed workflow (``workflow.Budget``); null = unlimited."""

    max_steps: int | None = 5
    max_tokens: int | None = None
    max_cost_usd: float | None = None


@dataclass(frozen=True)
class CapsSettings:
    """When a GRPO run stops by itself, with a checkpoint of the step it stopped at.

    ``max_masked_rate``: stop once the share of masked rollouts (infrastructure failures
    after every retry, ``grpo/rollouts/masked_rate``) has been above this for
    ``masked_rate_window`` consecutive steps: such steps train on little or no signal.
    ``max_worker_cost_usd``: stop once the worker dollars the rollouts spent in this run
    (all stages, all processes, carried over a resume) reach this. Null: no cap. Not part
    of the run fingerprint, so a run stopped by a cap continues from its checkpoint once
    the cap is raised.
    """

    max_masked_rate: float | None = None
    masked_rate_window: int = 5
    max_worker_cost_usd: float | None = None

    def __post_init__(self) -> None:
        if self.max_masked_rate is not None:
            _check(0 <= self.max_masked_rate < 1, "max_masked_rate must be in [0, 1) or null")
        _check(self.masked_rate_window >= 1, "masked_rate_window must be at least 1")
        if self.max_worker_cost_usd is not None:
            _check(self.max_worker_cost_usd > 0, "max_worker_cost_usd must be positive or null")


@dataclass(frozen=True)
class TrainingConfig:
    """Everything the training pipeline needs besides the data and the worker pool.

    ``base_model``: ``smollm2-135m-instruct`` (the offline SmolLM2 copy), a Hugging Face id
    or a local folder. ``max_prompt_tokens``: prompts longer than this are dropped from the
    GRPO dataset (GRPO has no prompt truncation). ``max_question_tokens``: questions longer
    than this are dropped too (null: keep all); the sandbox uses it because a subtask must
    restate the question, so long questions cannot fit a short completion. ``output_dir``: checkpoints and adapters,
    one sub-folder per run fingerprint. ``resume``: continue from the newest checkpoint of
    the same fingerprint.
    """

    base_model: str = SMOLLM2
    seed: int = 42
    max_train_tasks: int | None = None
    max_prompt_tokens: int = 1024
    max_question_tokens: int | None = None
    output_dir: str = "data/06_models/conductor"
    resume: bool = True
    grpo: GRPOSettings = field(default_factory=GRPOSettings)
    lora: LoraSettings = field(default_factory=LoraSettings)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sft: SFTSettings = field(default_factory=SFTSettings)
    recursion: RecursionSettings = field(default_factory=RecursionSettings)
    curriculum: CurriculumSettings = field(default_factory=CurriculumSettings)
    budget: BudgetSettings = field(default_factory=BudgetSettings)
    caps: CapsSettings = field(default_factory=CapsSettings)

    def __post_init__(self) -> None:
        _check(bool(self.base_model), "base_model must not be empty")
        _check(self.max_prompt_tokens >= 16, "max_prompt_tokens must be at least 16")
        if self.max_train_tasks is not None:
            _check(self.max_train_tasks >= 1, "max_train_tasks must be at least 1 or null")
        if self.max_question_tokens is not None:
            _check(self.max_question_tokens >= 1, "max_question_tokens must be at least 1 or null")
        # LoRA trains a small update that starts at zero, so at a full fine-tune's rate it
        # learns far more slowly than the run it copies; 200 paper-sized steps would end
        # close to the base model. Refuse instead of spending a GPU run on it.
        _check(
            not self.lora.enabled or self.grpo.learning_rate > FULL_FINETUNE_LR,
            f"grpo.learning_rate {self.grpo.learning_rate:g} with LoRA (lora.enabled) is at or "
            f"below the paper's full fine-tune rate {FULL_FINETUNE_LR:g}; a LoRA adapter needs "
            "roughly 10x the full fine-tune rate (e.g. 1e-5)",
        )

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def from_params(
        cls, params: Mapping[str, Any] | None, where: str = "training"
    ) -> TrainingConfig:
        """Build and validate from the ``training`` parameters mapping."""
        return build_dataclass(cls, params or {}, where, TrainingConfigError)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-friendly dict (tuples as lists); ``from_params`` reads it back."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=list))

    # -- identity -------------------------------------------------------------------------
    # Keys that change where or how often things are written, or when a run stops, not
    # what is learned.
    _OPERATIONAL = frozenset({"output_dir", "resume", "caps"})
    _OPERATIONAL_GRPO = frozenset({"save_steps", "save_total_limit"})

    def fingerprint(self) -> str:
        """12 hex chars identifying everything that shapes the trained adapter."""
        data = self.to_dict()
        for key in self._OPERATIONAL:
            data.pop(key, None)
        for key in self._OPERATIONAL_GRPO:
            data["grpo"].pop(key, None)
        return content_hash(data)
