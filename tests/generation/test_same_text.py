"""A prompt, a seed and a temperature give one text whichever path generates it: GRPO
rollouts (``ConductorGRPOTrainer``'s ``rollout_func`` on a CPU), ``conductor ask`` (``LocalPolicy.complete``), and the continuous
batches of evaluation and the API (``LocalPolicy.complete_continuously``; rows joining a
running batch: tests/serving/test_batching.py). On the tiny random Llama, so that a
token is a near-uniform draw over the whole vocabulary: any difference in how a path draws
shows at once."""

from __future__ import annotations

import asyncio

import pytest
import torch

from conductor_pipeline.training.models import conductor_trainer_class
from conductor_pipeline.workflow.policy import LocalPolicy
from tests.local_batches import complete_batch

QUESTIONS = ["What is 2 + 3?", "Name a prime number larger than ten."]
GROUP = 3  # rollouts per question
TEMPERATURE = 0.7
MAX_TOKENS = 12


def _messages(question: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are the Conductor. Plan which worker answers."},
        {"role": "user", "content": f"Question: {question}"},
    ]


@pytest.fixture(scope="module")
def policy(tiny_model_dir) -> LocalPolicy:
    policy = LocalPolicy(model_dir=tiny_model_dir, torch_threads=1)
    policy.load()
    return policy


def _rollout_texts(policy: LocalPolicy) -> dict[tuple[str, int], str]:
    """Completions of every question, ``GROUP`` rollouts each, in one rollout batch of a
    real trainer, by question and the seed the row drew."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    group = GROUP
    trainer = conductor_trainer_class()(
        model=AutoModelForCausalLM.from_pretrained(policy.model_dir),  # as training loads it
        reward_funcs=lambda prompts, completions, **kw: [0.0] * len(prompts),
        args=GRPOConfig(
            output_dir=str(policy.model_dir.parent / "same-text"),
            use_cpu=True,
            report_to="none",
            num_generations=group,
            per_device_train_batch_size=group,
            max_completion_length=MAX_TOKENS,
            temperature=TEMPERATURE,
        ),
        train_dataset=Dataset.from_list([{"prompt": _messages(QUESTIONS[0])}] * group),
        processing_class=AutoTokenizer.from_pretrained(policy.model_dir),
    )
    questions = [q for q in QUESTIONS for _ in range(group)]
    # the rollouts draw one seed a row from torch's global generator
    torch.manual_seed(5)
    seeds = torch.randint(2**62, (len(questions),)).tolist()
    torch.manual_seed(5)
    out = trainer.rollout_func([_messages(q) for q in questions], trainer)
    tokenizer = trainer.processing_class
    texts = {
        (q, seed): tokenizer.decode(ids, skip_special_tokens=True).strip()
        for q, seed, ids in zip(questions, seeds, out["completion_ids"], strict=True)
    }
    return texts


def test_rollouts_ask_and_batches_write_the_same_text(policy):
    rollouts = _rollout_texts(policy)
    asked = {
        (q, s): asyncio.run(
            policy.complete(_messages(q), temperature=TEMPERATURE, max_tokens=MAX_TOKENS, seed=s)
        ).text
        for q, s in rollouts
    }
    rows = list(reversed(rollouts))  # another order than the rollouts'
    batched = asyncio.run(
        complete_batch(
            policy,
            [_messages(q) for q, _ in rows],
            temperature=TEMPERATURE,
            max_tokens=MAX_TOKENS,
            seeds=[s for _, s in rows],
        )
    )
    assert len(rollouts) == len(QUESTIONS) * GROUP
    assert len(set(rollouts.values())) == len(rollouts)  # every seed drew its own text
    assert asked == rollouts
    assert {row: c.text for row, c in zip(rows, batched, strict=True)} == rollouts
