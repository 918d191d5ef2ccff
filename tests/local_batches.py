"""One continuous batch of several conversations through a local policy, with nobody joining
it: what tests compare with the same conversations asked one at a time."""

from __future__ import annotations

from typing import Any

from conductor_pipeline.workflow.policy import PolicyCompletion


async def complete_batch(
    policy: Any,
    conversations: list[list[dict[str, str]]],
    *,
    temperature: float,
    max_tokens: int,
    seeds: list[int],
) -> list[PolicyCompletion]:
    """``policy.complete_continuously`` over ``conversations`` (row ``i`` seeded with
    ``seeds[i]``), the completions in the conversations' order."""
    if len(seeds) != len(conversations):
        raise ValueError("complete_batch: one seed per conversation")
    replies: dict[int, PolicyCompletion] = {}
    await policy.complete_continuously(
        [(i, c, s) for i, (c, s) in enumerate(zip(conversations, seeds, strict=True))],
        temperature=temperature,
        max_tokens=max_tokens,
        more=lambda _: [],
        done=replies.__setitem__,
    )
    return [replies[i] for i in range(len(conversations))]
