"""A prompt, a seed and a temperature give one text whichever path generates it: GRPO
rollouts (``shared_prefill_generate``, what ``ConductorGRPOTrainer._generate_single_turn``
runs on a CPU), ``conductor ask`` (``LocalPolicy.complete``), evaluation's batches and the
API's micro-batcher (``LocalPolicy.complete_many``; the API's continuous batches give
``complete``'s texts: tests/serving/test_batching.py). On the tiny random Llama, so that a
token is a near-uniform draw over the whole vocabulary: any difference in how a path draws
shows at once."""

from __future__ import annotations

import asyncio

import pytest

from conductor_pipeline.training.fast_paths import shared_prefill_generate
from conductor_pipeline.workers.local_model import encode_chat
from conductor_pipeline.workflow.policy import LocalPolicy

QUESTIONS = ["What is 2 + 3?", "Name a prime number larger than ten."]
SEEDS = [11, 12, 13]
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
    """Completions of every question, one row per seed, all in one rollout batch."""
    from transformers import AutoModelForCausalLM

    tokenizer = policy._tokenizer
    model = AutoModelForCausalLM.from_pretrained(policy.model_dir)  # as the trainer loads it
    rows = [(q, s) for q in QUESTIONS for s in SEEDS]
    completions = shared_prefill_generate(
        model,
        [encode_chat(tokenizer, _messages(q))[0] for q, _ in rows],
        max_new_tokens=MAX_TOKENS,
        eos_token_ids=[tokenizer.eos_token_id],
        seeds=[s for _, s in rows],
        temperature=TEMPERATURE,
    )
    return {
        row: tokenizer.decode(ids, skip_special_tokens=True).strip()
        for row, ids in zip(rows, completions, strict=True)
    }


def test_rollouts_ask_and_batches_write_the_same_text(policy):
    rollouts = _rollout_texts(policy)
    asked = {
        (q, s): asyncio.run(
            policy.complete(_messages(q), temperature=TEMPERATURE, max_tokens=MAX_TOKENS, seed=s)
        ).text
        for q in QUESTIONS
        for s in SEEDS
    }
    rows = [(q, s) for s in SEEDS for q in QUESTIONS]  # another order than the rollouts'
    batched = asyncio.run(
        policy.complete_many(
            [_messages(q) for q, _ in rows],
            temperature=TEMPERATURE,
            max_tokens=MAX_TOKENS,
            seeds=[s for _, s in rows],
        )
    )
    assert len(set(rollouts.values())) == len(rollouts)  # every seed drew its own text
    assert asked == rollouts
    assert {row: c.text for row, c in zip(rows, batched, strict=True)} == rollouts
