"""LocalPolicy's batches (``complete_continuously``): batched generation that keeps each row's
seed."""

from __future__ import annotations

import asyncio

import pytest

from conductor_pipeline.evaluation import batching_policy
from conductor_pipeline.evaluation.policies import batch_stats
from conductor_pipeline.workflow import LocalPolicy
from tests.local_batches import complete_batch

CONVERSATIONS = [
    [{"role": "user", "content": "Plan a workflow for: what is 2 + 2?"}],
    [
        {"role": "system", "content": "You coordinate workers."},
        {
            "role": "user",
            "content": "A much longer question, so that the batch needs padding: " * 4,
        },
    ],
    [{"role": "user", "content": "Prefilled."}, {"role": "assistant", "content": "model_id = ["}],
]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_rows_equal_one_at_a_time_and_ignore_their_batch(tiny_model_dir, temperature):
    policy = LocalPolicy(model_dir=tiny_model_dir)
    seeds = [11, 12, 13]

    async def go():
        single = [
            await policy.complete(c, temperature=temperature, max_tokens=12, seed=s)
            for c, s in zip(CONVERSATIONS, seeds, strict=True)
        ]
        batch = await complete_batch(
            policy, CONVERSATIONS, temperature=temperature, max_tokens=12, seeds=seeds
        )
        alone = await complete_batch(
            policy, CONVERSATIONS[1:2], temperature=temperature, max_tokens=12, seeds=seeds[1:2]
        )
        return single, batch, alone

    single, batch, alone = asyncio.run(go())
    assert [c.text for c in batch] == [c.text for c in single]
    assert [c.prompt_tokens for c in batch] == [c.prompt_tokens for c in single]
    assert [c.completion_tokens for c in batch] == [c.completion_tokens for c in single]
    assert alone[0].text == batch[1].text


def test_batching_wrapper_groups_concurrent_requests(tiny_model_dir):
    policy = batching_policy(LocalPolicy(model_dir=tiny_model_dir), max_batch=2, wait_s=0.05)

    async def go():
        return await asyncio.gather(
            *(
                policy.complete(c, temperature=1.0, max_tokens=6, seed=i)
                for i, c in enumerate(CONVERSATIONS)
            )
        )

    out = asyncio.run(go())
    # two start the batch; the third joins it once a row has left
    stats = batch_stats(policy)  # what evaluation_run_info.json reports
    assert len(out) == 3 and stats.batch_sizes == [2] and stats.joined == 1
    assert batch_stats(policy.policy).batches == 0  # an unbatched policy: nothing


OPENING = "You plan work for a team of workers and never answer yourself. " * 6
SHARED = [
    [{"role": "system", "content": OPENING}, {"role": "user", "content": "Question: 2 + 2?"}],
    [
        {"role": "system", "content": OPENING},
        {"role": "user", "content": "Question: a longer one, to pad the batch in the middle."},
    ],
    [
        {"role": "system", "content": OPENING},
        {"role": "user", "content": "Question: x?"},
        {"role": "assistant", "content": "model_id = ["},
    ],
]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_shared_opening_is_computed_once_and_changes_nothing(tiny_model_dir, temperature):
    policy = LocalPolicy(model_dir=tiny_model_dir)
    seeds = [3, 4, 5]

    async def go():
        single = [
            await policy.complete(c, temperature=temperature, max_tokens=10, seed=s)
            for c, s in zip(SHARED, seeds, strict=True)
        ]
        batch = await complete_batch(
            policy, SHARED, temperature=temperature, max_tokens=10, seeds=seeds
        )
        kept = policy.engine.prefix[0]
        later = await complete_batch(
            policy, SHARED[1:2], temperature=temperature, max_tokens=10, seeds=seeds[1:2]
        )
        return single, batch, kept, later

    single, batch, kept, later = asyncio.run(go())
    assert len(kept) > 32  # the opening was cached ...
    assert policy.engine.prefix[0] == kept  # ... and reused by a later one-row batch
    assert [c.text for c in batch] == [c.text for c in single]
    assert [c.prompt_tokens for c in batch] == [c.prompt_tokens for c in single]
    assert later[0].text == single[1].text


def test_the_kept_opening_is_never_written_to(tiny_model_dir):
    """Batches and single requests start from views of the kept opening's keys and values,
    not copies: rows that finish early (the batch moves rows into their places, in place)
    and single requests that crop their guesses must leave the kept tensors as they were."""
    policy = LocalPolicy(model_dir=tiny_model_dir, lookup_tokens=4)

    import torch

    def kept_tensors() -> list:
        return [t.clone() for kv in policy.engine.prefix[1] for t in kv]

    async def go():
        await complete_batch(policy, SHARED, temperature=1.0, max_tokens=12, seeds=[1, 2, 3])
        before = kept_tensors()
        for seed in range(3):
            await complete_batch(
                policy, SHARED, temperature=1.0, max_tokens=12, seeds=[seed, seed + 5, seed + 9]
            )
            await policy.complete(SHARED[0], temperature=1.0, max_tokens=12, seed=seed)
        return before

    before = asyncio.run(go())
    # each of the six later generations started from it (a batch once per group of
    # prompts of similar length)
    assert policy.prefix_hits >= 6
    after = kept_tensors()
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_rows_that_share_part_of_the_kept_opening_start_from_its_first_columns(tiny_model_dir):
    """A kept opening that ran into the first batch's questions ("Question: What is") still
    serves rows that share only the template's part of it: they start from its first columns
    (no prompt pass over the opening, the kept opening unchanged) and write what a policy
    without a kept opening writes."""
    question = [
        [
            {"role": "system", "content": OPENING},
            {"role": "user", "content": f"Question: What is {q}?"},
        ]
        for q in ("2 + 2", "the capital of France")
    ]
    other = [{"role": "system", "content": OPENING}, {"role": "user", "content": "Name a prime."}]
    policy = LocalPolicy(model_dir=tiny_model_dir)
    fresh = LocalPolicy(model_dir=tiny_model_dir)

    async def go():
        await complete_batch(policy, question, temperature=1.0, max_tokens=6, seeds=[1, 2])
        kept = policy.engine.prefix[0]
        hits = policy.prefix_hits
        reply = await policy.complete(other, temperature=1.0, max_tokens=6, seed=3)
        alone = await fresh.complete(other, temperature=1.0, max_tokens=6, seed=3)
        return kept, hits, reply, alone

    from transformers import AutoTokenizer

    from conductor_pipeline.generation.chat import encode_chat

    kept, hits, reply, alone = asyncio.run(go())
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [encode_chat(tokenizer, m)[0] for m in (*question, other)]
    assert rows[0][: len(kept)] == list(kept) and rows[2][: len(kept)] != list(kept)
    assert policy.engine.prefix[0] == kept and policy.prefix_hits == hits + 1
    assert reply.text == alone.text
