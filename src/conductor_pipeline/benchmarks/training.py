"""Training benchmarks: GRPO reward throughput (``rewards``) and the cost of one GRPO step,
stock TRL against the project's trainer (``training``)."""

from __future__ import annotations

import time
from typing import Any

from conductor_pipeline.benchmarks import bench_tasks, benchmark


@benchmark("rewards")
def rollout_scoring() -> dict[str, Any]:
    """GRPO reward throughput in the sandbox: 64 rollouts (16 prepared questions × a group of
    4; one- and two-step workflows) parsed, executed on the simulated workers at the sandbox's
    latency scale (0.02) and verified, first with an empty response cache, then again with
    the cache warm (every worker reply a hit)."""
    import asyncio
    import tempfile
    from pathlib import Path

    from conductor_pipeline.tasks import Task
    from conductor_pipeline.training.configs import RewardConfig
    from conductor_pipeline.training.rewards import ConductorReward
    from conductor_pipeline.workers import ResponseCache, WorkerPool
    from conductor_pipeline.workers.sandbox import SandboxServer
    from conductor_pipeline.workflow import PromptConfig

    group = 4
    tasks = [
        Task(
            f"bench/add/{i}",
            "math",
            "easy",
            f"Compute the sum of {1000 + i} and 4321.",
            str(5321 + i),
            "number",
            "numeric",
            "bench",
        )
        for i in range(16)
    ]
    plans = [
        "Worker 1 computes it.\nmodel_id = [1]\nsubtasks = ['Solve the question.']\n"
        "access_list = [[]]",
        "Worker 4 tries, Worker 0 checks.\nmodel_id = [4, 0]\nsubtasks = ['Solve the question.',"
        " 'Check the answer above.']\naccess_list = [[], 'all']",
    ]
    texts = [plans[i % 2] for i in range(len(tasks) * group)]
    batch = [task for task in tasks for _ in range(group)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with SandboxServer(
            tasks_paths=bench_tasks(folder, tasks), latency_scale=0.02, load_real_model=False
        ) as server:
            entries = [e for e in server.pool_config() if e["name"] != "smollm2-135m"]

            async def run() -> dict[str, Any]:
                pool = WorkerPool.from_config(
                    {"workers": entries}, cache=ResponseCache(folder / "cache.sqlite")
                )
                reward = ConductorReward(
                    pool,
                    pool.names,
                    pool.descriptions,
                    PromptConfig(question_to_workers=True),
                    RewardConfig(),
                    num_generations=group,
                )
                seconds = []
                for _ in ("cold", "warm"):
                    start = time.perf_counter()
                    scores = await reward.score_batch(texts, batch)
                    seconds.append(time.perf_counter() - start)
                    assert all(s.parsed for s in scores)
                await pool.aclose()
                n = len(texts)
                return {
                    "rollouts": n,
                    "cold_cache_rollouts_per_s": n / seconds[0],
                    "warm_cache_rollouts_per_s": n / seconds[1],
                    "cold_s": seconds[0],
                    "warm_s": seconds[1],
                    # the plans alternate one and two steps
                    "worker_calls_per_pass": sum(1 + i % 2 for i in range(n)),
                }

            return asyncio.run(run())


# -- one GRPO step on CPU: stock TRL against the project's trainer ---------------------------------

# Sandbox-like questions (about 100-300 tokens each), one per domain the sandbox trains on.
_TRAINING_QUESTIONS = [
    "A bakery sells muffins in boxes of 6 and cookies in boxes of 8. On Monday it sold 14 "
    "boxes of muffins and 9 boxes of cookies. On Tuesday it sold twice as many boxes of "
    "muffins as on Monday but 3 fewer boxes of cookies. A muffin costs $1.75 and a cookie "
    "$0.60. The bakery pays $48 a day in rent and $0.35 in ingredients for every item it "
    "sells. What was the bakery's total profit over the two days, in dollars?",
    "On an island every inhabitant is either a knight, who always tells the truth, or a "
    "knave, who always lies. You meet four inhabitants: Ada, Ben, Cleo and Dan. Ada says: "
    '"Ben and Cleo are of the same kind." Ben says: "Dan is a knave." Cleo says: "Ada is a '
    'knight or Dan is a knight, but not both." Dan says: "Exactly two of us four are '
    'knights." Exactly how many of the four are knights, and which ones? Explain which '
    "statements rule out the other possibilities, then give the names of the knights.",
    "Write a Python function merge_intervals(intervals: list[list[int]]) -> "
    "list[list[int]].\n"
    '    """Merge all overlapping closed intervals and return them sorted by start.\n\n'
    "    Two intervals overlap when they share at least one point, so [1, 3] and [3, 5] "
    "merge into [1, 5]. The input may be empty, unsorted, and may contain intervals "
    "nested in others.\n\n"
    "    >>> merge_intervals([[1, 3], [2, 6], [8, 10], [15, 18]])\n"
    "    [[1, 6], [8, 10], [15, 18]]\n"
    "    >>> merge_intervals([[5, 7], [1, 4], [4, 5]])\n"
    "    [[1, 7]]\n"
    "    >>> merge_intervals([[1, 10], [2, 3], [4, 5]])\n"
    "    [[1, 10]]\n"
    "    >>> merge_intervals([])\n"
    "    []\n"
    '    """',
    "A robot starts in the top-left cell of a 5 x 6 grid and must reach the bottom-right "
    "cell. At each move it goes one cell right or one cell down. The cells in row 2, "
    "column 3 and in row 4, column 2 (counting rows and columns from 1 at the top-left) "
    "hold rocks and cannot be entered. In how many different ways can the robot reach "
    "its goal? Then say how the answer changes if the robot may also move one cell "
    "diagonally down and to the right, with the same rocks in place.",
    "Which of the following best explains why the ocean's surface layer in the tropics "
    "is often poor in nutrients even though sunlight is plentiful there?\n"
    "A) Tropical water is too warm for phytoplankton to take up nitrate and phosphate.\n"
    "B) A strong, permanent thermocline limits the mixing of deep, nutrient-rich water "
    "into the sunlit surface layer.\n"
    "C) Heavy rainfall dilutes the nutrients faster than rivers can supply them.\n"
    "D) Coral reefs absorb most of the dissolved nutrients before they reach open water.\n"
    "Answer with the letter of the correct option and one sentence of justification.",
    "A game uses two fair six-sided dice. A player rolls both dice; if the sum is 7 or "
    "11 the player wins immediately, and if the sum is 2, 3 or 12 the player loses "
    "immediately. Any other sum becomes the player's point, and the player keeps "
    "rolling both dice until either the point comes up again (a win) or a 7 comes up (a "
    "loss). (a) What is the probability that the player wins the game? Give it as a "
    "fraction in lowest terms. (b) What is the expected number of rolls in one game? "
    "(c) If the player bets $10 at even money on every game, what is the expected gain "
    "or loss after 100 games, to the nearest cent?",
]


def _sandbox_worker_descriptions() -> list[str]:
    """The six sandbox workers' descriptions (conf/base/sandbox_workers.yml)."""
    from conductor_pipeline.workers.sandbox.profiles import default_profiles_path, load_profiles

    profiles = load_profiles(default_profiles_path())
    return [p.description for p in (*profiles.simulated, *profiles.real)]


def _hash_reward(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """A deterministic reward in [0, 1) from the completion text: distinct completions get
    distinct rewards, so advantages are non-zero, with no worker pool involved."""
    import hashlib

    texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
    return [int(hashlib.sha256(t.encode()).hexdigest()[:8], 16) / 16**8 for t in texts]


def _timed_trainer(base: type, figures: dict[str, list[float]]) -> type:
    """``base`` with the seconds of generation, of the whole rollout (generation, rewards,
    advantages) and of each training step (rollout + loss forward and backward) recorded
    in ``figures``, and the prompt and completion lengths."""

    class Timed(base):  # type: ignore[misc, valid-type]
        def _generate(self, prompts):  # noqa: ANN001, ANN202
            start = time.perf_counter()
            out = super()._generate(prompts)
            figures["generation_s"].append(time.perf_counter() - start)
            figures["prompt_tokens"].extend(len(p) for p in out[0])
            figures["completion_tokens"].extend(len(c) for c in out[1])
            return out

        def _prepare_inputs(self, generation_batch):  # noqa: ANN001, ANN202
            start = time.perf_counter()
            out = super()._prepare_inputs(generation_batch)
            figures["rollout_s"].append(time.perf_counter() - start)
            return out

        def training_step(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            start = time.perf_counter()
            out = super().training_step(*args, **kwargs)
            figures["train_step_s"].append(time.perf_counter() - start)
            return out

    return Timed


def _run_grpo_steps(
    trainer_class: type, config: Any, rows: list[dict[str, Any]], steps: int, folder: Any
) -> dict[str, list[float]]:
    """Train ``steps`` GRPO steps with ``trainer_class`` and return per-step figures."""
    from collections import defaultdict

    from datasets import Dataset
    from transformers import TrainerCallback

    from conductor_pipeline.training.models import load_base, num_layers
    from conductor_pipeline.training.trainer_args import grpo_args, lora_config

    figures: dict[str, list[float]] = defaultdict(list)

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN202
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN202
            figures["step_s"].append(time.perf_counter() - self.start)

    model, tokenizer = load_base(config)
    trainer = _timed_trainer(trainer_class, figures)(
        model=model,
        reward_funcs=[_hash_reward],
        args=grpo_args(
            config, folder, max_steps=steps, overrides={"save_strategy": "no", "logging_steps": 1}
        ),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=lora_config(config, num_layers(model)),
        callbacks=[StepClock()],
    )
    trainer.train()
    figures["fast_path_calls"] = list(getattr(trainer, "fast_path_calls", {}).values())
    return figures


def training_step_benchmark(
    config: Any,
    prompt: Any,
    descriptions: list[str],
    *,
    steps: int = 2,
    warmup: int = 1,
) -> dict[str, Any]:
    """Seconds per GRPO step of stock ``trl.GRPOTrainer`` and of the project's trainer, with
    the same ``GRPOConfig`` (``trainer_args.grpo_args(config)``), model, LoRA, prompts and reward.

    Each trainer trains ``warmup + steps`` steps; the first ``warmup`` are not measured.
    ``generation_s`` is the time in TRL's ``_generate`` (tokenizing and generating the
    rollouts: TRL's generation, or the engine through ``rollout_func``), ``scoring_s`` the loss
    forward and backward (a training step minus its rollout), ``other_s`` the rest of the
    step (rewards, advantages, optimizer, TRL's bookkeeping).
    """
    import statistics
    import tempfile
    from pathlib import Path

    from trl import GRPOTrainer

    from conductor_pipeline.training.models import conductor_trainer_class
    from conductor_pipeline.workflow import conductor_messages

    total = warmup + steps
    n_prompts = total * config.grpo.prompts_per_step
    questions = [_TRAINING_QUESTIONS[i % len(_TRAINING_QUESTIONS)] for i in range(n_prompts)]
    rows = [{"prompt": conductor_messages(q, descriptions, prompt)} for q in questions]

    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else float("nan")

    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, trainer_class in (("stock", GRPOTrainer), ("project", conductor_trainer_class())):
            raw = _run_grpo_steps(trainer_class, config, rows, total, Path(tmp) / name)
            per_step = len(raw["completion_tokens"]) // total
            step = raw["step_s"][warmup:]
            generation = raw["generation_s"][warmup:]
            rollout = raw["rollout_s"][warmup:]
            scoring = [t - r for t, r in zip(raw["train_step_s"][warmup:], rollout, strict=True)]
            completions = raw["completion_tokens"][warmup * per_step :]
            figures[f"{name}_step_s"] = mean(step)
            figures[f"{name}_generation_s"] = mean(generation)
            figures[f"{name}_scoring_s"] = mean(scoring)
            figures[f"{name}_other_s"] = mean(step) - mean(generation) - mean(scoring)
            figures[f"{name}_completion_tokens_mean"] = mean(completions)
            figures[f"{name}_completion_tokens_per_step"] = sum(completions) / steps
            figures[f"{name}_seconds_per_completion_token"] = (
                sum(step) / sum(completions) if completions else float("nan")
            )
            figures[f"{name}_step_s_all"] = [round(s, 3) for s in raw["step_s"]]
            if name == "project":
                figures["project_fast_path_calls"] = dict(
                    zip(("generation", "scoring"), raw["fast_path_calls"], strict=False)
                )
            prompt_tokens = raw["prompt_tokens"]
    figures["step_cost_ratio"] = figures["stock_step_s"] / figures["project_step_s"]
    figures["generation_cost_ratio"] = (
        figures["stock_generation_s"] / figures["project_generation_s"]
    )
    figures["scoring_cost_ratio"] = figures["stock_scoring_s"] / figures["project_scoring_s"]
    figures["per_completion_token_cost_ratio"] = (
        figures["stock_seconds_per_completion_token"]
        / figures["project_seconds_per_completion_token"]
    )
    figures.update(
        steps_measured=steps,
        warmup_steps=warmup,
        num_generations=config.grpo.num_generations,
        prompts_per_step=config.grpo.prompts_per_step,
        max_completion_length=config.grpo.max_completion_length,
        prompt_tokens_min=min(prompt_tokens),
        prompt_tokens_mean=mean(prompt_tokens),
        prompt_tokens_max=max(prompt_tokens),
        base_model=config.base_model,
    )
    return figures


@benchmark("training")
def training_step_cost() -> dict[str, Any]:
    """One sandbox GRPO step on CPU: stock TRL against the project's trainer (SmolLM2-135M,
    the sandbox LoRA and GRPO settings of conf/base/parameters_training.yml, the sandbox
    prompt of conf/base/parameters_conductor.yml with the six sandbox workers, a hash
    reward), each after one warm-up step. The time grows with the configured rollouts per
    step (stock TRL: about 12 minutes a step for 8 x 4 rollouts on one busy core), so the
    environment can override: ``BENCH_TRAINING_STEPS`` (measured steps, default 1),
    ``BENCH_NUM_GENERATIONS``, ``BENCH_PROMPTS_PER_STEP``, ``BENCH_MAX_COMPLETION_LENGTH``,
    ``BENCH_TORCH_THREADS`` (default: torch's; on a 2-core box shared with other work, 1
    avoids OpenMP threads waiting on each other)."""
    import os

    import torch
    import yaml

    from conductor_pipeline.paths import project_root
    from conductor_pipeline.training.configs import TrainingConfig
    from conductor_pipeline.workers.torch_thread import set_torch_threads
    from conductor_pipeline.workflow.config import prompt_config

    conf = project_root() / "conf" / "base"
    training = yaml.safe_load((conf / "parameters_training.yml").read_text())["training"]
    conductor = yaml.safe_load((conf / "parameters_conductor.yml").read_text())["conductor"]
    grpo = dict(training.get("grpo") or {})
    for key in ("num_generations", "prompts_per_step", "max_completion_length"):
        value = os.environ.get(f"BENCH_{key.upper()}")
        if value:
            grpo[key] = int(value)
    config = TrainingConfig.from_params({**training, "grpo": grpo})
    threads = os.environ.get("BENCH_TORCH_THREADS")
    if threads:
        set_torch_threads(int(threads))
    load_before = os.getloadavg()[0]
    figures = training_step_benchmark(
        config,
        prompt_config(conductor.get("prompt")),
        _sandbox_worker_descriptions(),
        steps=int(os.environ.get("BENCH_TRAINING_STEPS", "1")),
    )
    figures["torch_threads"] = torch.get_num_threads()
    # other processes on the box slow both trainers, unevenly: the load says how busy it was
    figures["load_average_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return figures


def sft_step_benchmark(
    config: Any, prompt: Any, descriptions: list[str], repeats: int = 3
) -> dict[str, Any]:
    """Seconds of one warm-start loss pass, forward and backward, over 4 of the benchmark's
    prompts with a three-step workflow as the reply: through the whole model against from
    the recorded states entering the first LoRA layer (medians of ``repeats``, alternating,
    after one warm-up pass each). ``config``: a ``TrainingConfig`` (base model, LoRA, bf16)."""
    import contextlib
    import statistics

    import torch
    from peft import get_peft_model

    from conductor_pipeline.generation.chat import encode_chat
    from conductor_pipeline.training.fast_paths import first_trainable_layer
    from conductor_pipeline.training.models import load_base, num_layers
    from conductor_pipeline.training.sft import completion_loss
    from conductor_pipeline.training.trainer_args import lora_config, use_bf16
    from conductor_pipeline.workflow import conductor_messages

    model, tokenizer = load_base(config)
    model = get_peft_model(model, lora_config(config, num_layers(model)))
    model.train()
    reply = (
        "Two workers try it, a third compares their answers.\nmodel_id = [2, 1, 0]\n"
        "subtasks = ['Solve the question.', 'Solve the question.', 'Compare the two answers "
        "and give the correct one.']\naccess_list = [[], [], 'all']"
    )
    rows = []
    for question in _TRAINING_QUESTIONS[:4]:
        head, _ = encode_chat(tokenizer, conductor_messages(question, descriptions, prompt))
        rows.append((head, tokenizer(reply + tokenizer.eos_token)["input_ids"]))
    width = max(len(p) + len(c) for p, c in rows)
    fill = [width - len(p) - len(c) for p, c in rows]
    batch = {
        "input_ids": torch.tensor(
            [p + c + [tokenizer.pad_token_id] * f for (p, c), f in zip(rows, fill, strict=True)]
        ),
        "attention_mask": torch.tensor(
            [[1] * (len(p) + len(c)) + [0] * f for (p, c), f in zip(rows, fill, strict=True)]
        ),
        "labels": torch.tensor(
            [[-100] * len(p) + c + [-100] * f for (p, c), f in zip(rows, fill, strict=True)]
        ),
    }
    bf16 = use_bf16(config.grpo.bf16, use_cpu=True)
    states: dict = {}

    def step(frozen: dict | None) -> float:
        precision = (
            torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        )
        start = time.perf_counter()
        with precision:
            loss = completion_loss(model, batch, frozen_states=frozen)
        loss.backward()
        model.zero_grad()
        return time.perf_counter() - start

    step(None), step(states)  # warm-up; the second records the states
    whole, recorded = [], []
    for _ in range(repeats):
        whole.append(step(None))
        recorded.append(step(states))
    return {
        "whole_model_s": statistics.median(whole),
        "from_recorded_states_s": statistics.median(recorded),
        "ratio": statistics.median(recorded) / statistics.median(whole),
        "rows": len(rows),
        "tokens_per_row": [len(p) + len(c) for p, c in rows],
        "frozen_layers": first_trainable_layer(model),
        "recorded_examples": len(states),
        "bf16": bf16,
        "torch_threads": torch.get_num_threads(),
    }


@benchmark("sft")
def warm_start_step_cost() -> dict[str, Any]:
    """One warm-start (SFT) loss pass on CPU, forward and backward: through the whole model
    (an example's first epoch) against from the recorded states entering the first LoRA
    layer (an example seen before; ``training/sft.py``, ``completion_loss``). SmolLM2-135M
    with the sandbox LoRA and precision (conf/base/parameters_training.yml) and the sandbox
    prompt (conf/base/parameters_conductor.yml) with the six sandbox workers."""
    import yaml

    from conductor_pipeline.paths import project_root
    from conductor_pipeline.training.configs import TrainingConfig
    from conductor_pipeline.workflow.config import prompt_config

    conf = project_root() / "conf" / "base"
    training = yaml.safe_load((conf / "parameters_training.yml").read_text())["training"]
    conductor = yaml.safe_load((conf / "parameters_conductor.yml").read_text())["conductor"]
    return sft_step_benchmark(
        TrainingConfig.from_params(training),
        prompt_config(conductor.get("prompt")),
        _sandbox_worker_descriptions(),
    )
