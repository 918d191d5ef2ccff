"""GRPO with TRL 1.16 on a tiny random Llama: masking semantics, the real reward path, resume."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from conductor_pipeline.training.configs import CurriculumSettings, TrainingConfig
from conductor_pipeline.training.grpo import train_conductor
from conductor_pipeline.training.inputs import PoolInfo, build_prompt_dataset
from conductor_pipeline.training.trainer_args import grpo_args
from conductor_pipeline.workflow import conductor_messages, parse_workflow
from conductor_pipeline.workflow.config import orchestration_config, prompt_config

from .fakes import FakePool, make_task

pytestmark = pytest.mark.slow


# -- what TRL does with a None reward -----------------------------------------------------------------


def test_trl_gives_a_masked_rollout_zero_advantage_and_zero_gradient(tiny_model_dir):
    """A ``None`` reward (our masked rollout) must not become a 0 reward: TRL 1.16 leaves it
    out of its group's mean and std, gives it advantage exactly 0, and its policy loss has
    no gradient."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from conductor_pipeline.training.models import conductor_trainer_class

    pattern = [None, 1.0, 0.5, 0.0, 0.5, None, None, 1.0]
    captured: dict = {}

    def reward(prompts, completions, **kwargs):
        return list(pattern)

    class Capturing(conductor_trainer_class()):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            captured.setdefault("batch", out)
            return out

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    args = GRPOConfig(
        output_dir=str(tiny_model_dir.parent / "mask-run"),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=8,
        max_steps=1,
        save_strategy="no",
        loss_type="dapo",
        beta=0.0,
        disable_tqdm=True,
        seed=0,
    )
    prompts = [{"prompt": [{"role": "user", "content": f"question {i}"}]} for i in range(4)]
    trainer = Capturing(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(prompts),
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
        ),
    )
    trainer.train()
    batch = captured["batch"]
    advantages = batch["advantages"].tolist()

    def expected(group):
        valid = torch.tensor([r for r in group if r is not None])
        mean, std = valid.mean(), valid.std()
        return [0.0 if r is None else float((r - mean) / (std + 1e-4)) for r in group]

    assert advantages == pytest.approx(expected(pattern[:4]) + expected(pattern[4:]), abs=1e-5)
    assert advantages[0] == 0.0 and advantages[5] == 0.0 and advantages[6] == 0.0
    # had None been scored 0, the masked rollout would have a negative advantage
    naive = torch.tensor([0.0, 1.0, 0.5, 0.0])
    assert float((naive[0] - naive.mean()) / (naive.std() + 1e-4)) < -0.5

    # the masked rollout alone produces no gradient under the configured loss
    n = batch["advantages"].shape[0]
    only_masked = {
        key: (
            value[0:1]
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n
            else value
        )
        for key, value in batch.items()
    }
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, only_masked)
    loss.backward()
    grads = [p.grad for p in trainer.model.parameters() if p.requires_grad]
    assert grads and all(g is None or torch.count_nonzero(g) == 0 for g in grads)


# -- the Conductor's own training stage ------------------------------------------------------------------


QUESTION = make_task().question
N_TASKS = 4
PROMPT = {"few_shot": []}  # conductor.prompt for these runs: no worked examples


def _tasks():
    # same question under several ids, so one forced completion fits every prompt
    return [make_task(i) for i in range(N_TASKS)]


def _config(tiny_model_dir: Path, out: Path, **grpo) -> TrainingConfig:
    return TrainingConfig.from_params(
        {
            "base_model": str(tiny_model_dir),
            "seed": 0,
            "output_dir": str(out),
            "grpo": {
                "num_generations": 4,
                "prompts_per_step": 2,
                "max_steps": 2,
                "max_completion_length": 48,
                "learning_rate": 1e-3,
                "save_steps": 1,
                **grpo,
            },
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            "sft": {"enabled": False},
            "reward": {"retry_delay_s": 0.0, "infra_retries": 1},
        }
    )


def _forcing(tokenizer, branches: list[str], context: int = 6) -> dict:
    """``generation_kwargs`` that make a random model write one of ``branches`` (chosen at
    random where they differ), then stop: a strong ``sequence_bias`` on each next token."""
    tail = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"][-3:]
    bias: dict[tuple[int, ...], float] = {}
    for text in branches:
        ids = (
            list(tail)
            + tokenizer(text, add_special_tokens=False)["input_ids"]
            + [tokenizer.eos_token_id]
        )
        for i in range(len(tail), len(ids)):
            bias[tuple(ids[max(0, i - context) : i + 1])] = 60.0
    return {"sequence_bias": [[list(k), v] for k, v in bias.items()]}


def _branches() -> list[str]:
    return [
        f"Route it.\nmodel_id = [{w}]\nsubtasks = [{QUESTION!r}]\naccess_list = [[]]"
        for w in (0, 1, 2)
    ] + ["I will not plan this."]


def test_two_grpo_steps_through_the_real_reward_path(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tasks = _tasks()
    pool = FakePool(tasks)
    info = PoolInfo(pool, pool.names, pool.descriptions, pool.prices)
    config = _config(tiny_model_dir, tmp_path / "out", prompts_per_step=1)
    # with the curriculum's pre-pass: sim-bad answers every question wrong
    config = replace(config, curriculum=CurriculumSettings(reference_worker="sim-bad"))
    logged: list[tuple[dict, int]] = []
    result = train_conductor(
        tasks,
        info,
        config,
        prompt=PROMPT,
        log_metrics=lambda metrics, step: logged.append((metrics, step)),
        grpo_overrides={"generation_kwargs": _forcing(tokenizer, _branches())},
    )
    assert result.global_step == 2 and result.resumed_from is None
    assert (result.adapter_dir / "adapter_config.json").is_file()
    saved = json.loads((result.adapter_dir / "conductor_info.json").read_text())
    assert saved["config_fingerprint"] == config.fingerprint()
    assert saved["pool_fingerprint"] == info.fingerprint()
    assert saved["prompt"] == PROMPT  # the conductor.prompt it was trained with
    # workers are ordinals in the prompt (the default): no description was shown
    assert saved["conductor_descriptions"] == [""] * len(pool.descriptions)
    assert sorted(p.name for p in (result.run_dir / "grpo").glob("checkpoint-*")) == [
        "checkpoint-1",
        "checkpoint-2",
    ]
    assert [step for _, step in logged] == [1, 2]
    metrics = logged[-1][0]
    for key in (
        "grpo/reward/mean",
        "grpo/rollouts/parse_rate",
        "grpo/rollouts/masked_rate",
        "grpo/rollouts/infra_failure_rate",
        "grpo/workflow/steps_mean",
        "grpo/workflow/cost_usd_mean",
        "grpo/tokens_per_s",
        "grpo/loss",
    ):
        assert key in metrics, key
    # the forced completions really ran through parse → execute → verify
    assert sum(pool.calls.values()) > 0
    assert saved["dataset"]["curriculum_wrong"] == N_TASKS
    # every question is one sim-bad got wrong, so every step drew only such questions
    assert [m["grpo/curriculum/unsolved_share"] for m, _ in logged] == [1.0, 1.0]
    verdicts = json.loads((result.run_dir / "curriculum.json").read_text())["verdicts"]
    assert verdicts == dict.fromkeys((t.id for t in tasks), False)
    assert any(k.startswith("grpo/workers/share/") for k in metrics)
    rates = [m["grpo/rollouts/parse_rate"] for m, _ in logged]
    assert all(0.0 < r < 1.0 for r in rates)
    samples = [json.loads(line) for line in Path(saved["rollout_samples"]).read_text().splitlines()]
    assert {s["step"] for s in samples} == {1, 2}
    assert {"question", "completion", "reward", "parsed", "workers"} <= set(samples[0])


def test_resume_after_an_interruption_continues_from_the_last_checkpoint(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer, TrainerCallback

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tasks = _tasks()
    pool = FakePool(tasks)
    info = PoolInfo(pool, pool.names, pool.descriptions, pool.prices)
    config = _config(
        tiny_model_dir, tmp_path / "out", max_steps=4, num_generations=2, prompts_per_step=1
    )
    overrides = {"generation_kwargs": _forcing(tokenizer, _branches())}

    class Crash(RuntimeError):
        pass

    class StopAfterTwo(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise Crash("simulated interruption after the step-2 checkpoint")

    with pytest.raises(Crash):
        train_conductor(
            tasks,
            info,
            config,
            prompt=PROMPT,
            callbacks=[StopAfterTwo()],
            grpo_overrides=overrides,
        )

    logged: list[int] = []
    result = train_conductor(
        tasks,
        info,
        config,
        prompt=PROMPT,
        log_metrics=lambda m, step: logged.append(step),
        grpo_overrides=overrides,
    )
    assert result.resumed_from is not None and result.resumed_from.endswith("checkpoint-2")
    assert result.global_step == 4
    assert logged == [3, 4]  # only the steps after the checkpoint were trained again
    lines = (result.run_dir / "rollout_samples.jsonl").read_text().splitlines()
    steps = Counter(json.loads(line)["step"] for line in lines)
    assert steps == {1: 1, 2: 1, 3: 1, 4: 1}  # one sample per group, no step recorded twice


def test_prompt_dataset_drops_long_prompts_and_keeps_task_columns(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    long_task = make_task(9, 1, 1)
    long_task = type(long_task)(**{**long_task.__dict__, "id": "long", "question": "word " * 400})
    config = TrainingConfig.from_params({"max_prompt_tokens": 400})
    rows, report = build_prompt_dataset(
        [make_task(0), long_task],
        tokenizer,
        ["A: x", "B. y"],
        prompt_config({"few_shot": []}),
        config,
    )
    assert [r["id"] for r in rows] == ["t0"] and report["dropped_long_prompt"] == 1
    assert rows[0]["prompt"][-1]["content"].endswith(make_task(0).question)
    assert rows[0]["answer"] == "5"
    # the prompt the Conductor sees parses its own format rules
    assert parse_workflow("model_id = [0]\nsubtasks = ['x']\naccess_list = [[]]", 2)


def test_training_prompts_are_the_prompts_the_conductor_is_served_with(tiny_model_dir):
    """Training reads conductor.prompt itself: a copy of it in the training parameters
    once drifted from what evaluation and serving send (positional access, question to
    workers), so the trained Conductor was served a prompt it had not seen."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    section = {
        "few_shot": [],
        "question_to_workers": True,
        "positional_access": False,
        "max_steps": 3,
    }
    served = orchestration_config({"prompt": section}).prompt
    descriptions = ["Description of sim-good", "Description of sim-bad"]
    rows, _ = build_prompt_dataset(
        [make_task(0)], tokenizer, descriptions, prompt_config(section), TrainingConfig()
    )
    assert rows[0]["prompt"] == conductor_messages(make_task(0).question, descriptions, served)
    with pytest.raises(ValueError, match="conductor.prompt"):
        prompt_config({"worker_count": 3})


def test_cpu_scoring_matches_trl_fused_lm_head(tiny_model_dir):
    """The CPU override scores only completion positions but returns TRL's numbers."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from conductor_pipeline.training.models import conductor_trainer_class

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    args = GRPOConfig(
        output_dir=str(tiny_model_dir.parent / "score-run"),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        num_generations=2,
        per_device_train_batch_size=2,
        temperature=0.7,
    )
    trainer = conductor_trainer_class()(
        model=model,
        reward_funcs=lambda prompts, completions, **kw: [0.0] * len(prompts),
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "hello"}] * 2),
        processing_class=tokenizer,
    )
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (3, 20))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    with torch.no_grad():
        ours = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, 7, compute_entropy=True
        )
        trl = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, trainer.model, ids, mask, 7, compute_entropy=True
        )
    torch.testing.assert_close(ours[0], trl[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours[1], trl[1], atol=1e-4, rtol=1e-4)


def test_recursion_stage_runs_after_grpo(tiny_model_dir, tmp_path):
    """The recursion fine-tune continues from the GRPO adapter; round 1 is written by the
    model being trained (here random text, so the round-0 answer is kept)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tasks = _tasks()
    pool = FakePool(tasks)
    info = PoolInfo(pool, pool.names, pool.descriptions, pool.prices)
    base = _config(tiny_model_dir, tmp_path / "out", max_steps=1, prompts_per_step=1)
    config = TrainingConfig.from_params(
        {**base.to_dict(), "recursion": {"enabled": True, "max_steps": 1, "share": 0.5}}
    )
    # only worker 0 or 1, so no rollout is masked and round 0 always parses
    branches = _branches()[:2]
    logged: list[tuple[dict, int]] = []
    result = train_conductor(
        tasks,
        info,
        config,
        prompt=PROMPT,
        log_metrics=lambda metrics, step: logged.append((metrics, step)),
        grpo_overrides={
            "generation_kwargs": _forcing(tokenizer, branches),
            "max_completion_length": 48,
        },
    )
    assert result.global_step == 1 and result.recursion_steps == 1
    assert [step for _, step in logged] == [1, 2]
    recursion = logged[-1][0]
    assert recursion["recursion/recursion/rate"] == pytest.approx(0.5)
    assert "recursion/reward/mean" in recursion
    assert (result.run_dir / "recursion" / "final" / "adapter_config.json").is_file()


def test_training_continues_from_a_start_adapter_instead_of_the_warm_start(
    tiny_model_dir, tmp_path
):
    """Retraining starts from the champion's adapter: the SFT warm start is skipped, the
    run gets its own fingerprint, and the weights it starts from are the adapter's."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tasks = _tasks()
    pool = FakePool(tasks)
    info = PoolInfo(pool, pool.names, pool.descriptions, pool.prices)
    # two steps: the learning rate of the first one is 0 (schedule warm-up)
    config = _config(tiny_model_dir, tmp_path / "out", max_steps=2, prompts_per_step=1)
    first = train_conductor(
        tasks,
        info,
        config,
        prompt=PROMPT,
        grpo_overrides={"generation_kwargs": _forcing(tokenizer, _branches()[:2])},
    )
    start = first.adapter_dir
    with_sft = TrainingConfig.from_params(
        {**config.to_dict(), "sft": {"enabled": True, "n_examples": 2, "max_steps": 1}}
    )
    # one branch only: every rollout gets the same reward, so the advantages are 0 and the
    # step leaves the weights where they started
    second = train_conductor(
        tasks,
        info,
        with_sft,
        prompt=PROMPT,
        start_adapter=start,
        grpo_overrides={"generation_kwargs": _forcing(tokenizer, _branches()[:1])},
    )
    assert second.sft is None and second.start_adapter == str(start)
    assert second.run_fingerprint != first.run_fingerprint
    assert not (second.run_dir / "sft").exists()
    before = load_file(str(start / "adapter_model.safetensors"))
    after = load_file(str(second.adapter_dir / "adapter_model.safetensors"))
    assert before.keys() == after.keys()
    assert any(t.abs().sum() > 0 for k, t in before.items() if "lora_B" in k)  # not a fresh LoRA
    for key in before:
        torch.testing.assert_close(after[key], before[key])
    saved = json.loads((second.adapter_dir / "conductor_info.json").read_text())
    assert saved["start_adapter"] == str(start)


def test_balanced_domains_order_the_prompts_so_each_step_spans_the_domains(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    domains = ["math", "logic", "code", "algorithmic"]
    tasks = [make_task(i, i, 1, domain=domains[i % 3 if i < 30 else 3]) for i in range(40)]
    config = TrainingConfig.from_params({"grpo": {"balanced_domains": True}})
    rows, _ = build_prompt_dataset(
        tasks, tokenizer, ["A", "B"], prompt_config({"few_shot": []}), config
    )
    assert sorted(r["id"] for r in rows) == sorted(t.id for t in tasks)  # a reordering
    # while every domain has rows left, each window of 4 consecutive rows holds 4 domains
    first = [r["domain"] for r in rows[:40]]
    assert all(len(set(first[i : i + 4])) == 4 for i in range(0, 40, 4))
    again, _ = build_prompt_dataset(
        tasks, tokenizer, ["A", "B"], prompt_config({"few_shot": []}), config
    )
    assert [r["id"] for r in again] == [r["id"] for r in rows]  # seeded
    args = grpo_args(config, "/tmp/unused", use_cpu=True)
    assert args.shuffle_dataset is False  # TRL takes the rows in this order
    assert grpo_args(TrainingConfig(), "/tmp/unused", use_cpu=True).shuffle_dataset is True
