"""The reward functions by name: one TRL signature for all, and the rules for combining them."""

from __future__ import annotations

import pickle

import pytest
from trl.trainer.utils import get_callable_name, is_async_callable

from conductor_pipeline.training.configs import RewardConfig
from conductor_pipeline.training.rewards import (
    REWARD_FUNCS,
    ConductorReward,
    RewardContext,
    get_reward_funcs,
    task_columns,
)
from conductor_pipeline.training.rollout_stats import RolloutStats
from conductor_pipeline.workflow import PromptConfig

from .fakes import FakePool, make_task, workflow_text

TASK = make_task()


def _context(pool: FakePool, **overrides) -> RewardContext:
    settings = {
        "call_worker": pool,
        "worker_names": pool.names,
        "worker_descriptions": pool.descriptions,
        "prompt_config": PromptConfig(few_shot=[]),
        "reward_config": RewardConfig(retry_delay_s=0.0),
        **overrides,
    }
    return RewardContext(**settings)


def _trl_call(n: int, texts: list[str]) -> dict:
    """The keyword arguments TRL 1.16 passes a reward function, task columns included."""
    rows = [task_columns(TASK)] * n
    return {
        "prompts": [[{"role": "user", "content": TASK.question}]] * n,
        "completions": [[{"role": "assistant", "content": t}] for t in texts],
        "completion_ids": [[1, 2]] * n,
        "trainer_state": None,
        "log_extra": lambda *a, **k: None,
        "log_metric": lambda *a, **k: None,
        **{key: [row[key] for row in rows] for key in rows[0]},
    }


GOOD = workflow_text([0], [TASK.question], [[]])
WRONG = workflow_text([1], [TASK.question], [[]])
OUT_OF_POOL = workflow_text([7], [TASK.question], [[]])
PROSE = "I would ask the strongest worker."


@pytest.mark.parametrize("name", sorted(REWARD_FUNCS))
async def test_every_reward_function_takes_the_trl_call(name):
    (reward,) = get_reward_funcs([name], _context(FakePool([TASK])))
    texts = [GOOD, WRONG, OUT_OF_POOL, PROSE]
    out = reward(**_trl_call(len(texts), texts))
    if is_async_callable(reward):
        out = await out
    assert len(out) == len(texts)
    assert all(v is None or isinstance(v, float) for v in out)
    assert get_callable_name(reward) in {"conductor_reward", "format_reward"}


async def test_the_conductor_reward_is_built_from_the_context():
    pool = FakePool([TASK])
    stats = RolloutStats(pool.names)
    (reward,) = get_reward_funcs(["conductor"], _context(pool, num_generations=2, stats=stats))
    assert isinstance(reward, ConductorReward)
    assert reward.num_generations == 2 and reward.stats is stats
    assert await reward(**_trl_call(4, [GOOD, WRONG, OUT_OF_POOL, PROSE])) == [1.0, 0.5, 0.0, 0.0]
    assert stats.drain()["rollouts/parse_rate"] == pytest.approx(0.5)


def test_the_format_reward_only_parses():
    pool = FakePool([TASK])
    (reward,) = get_reward_funcs(["format"], _context(pool))
    assert reward(**_trl_call(4, [GOOD, WRONG, OUT_OF_POOL, PROSE])) == [1.0, 1.0, 0.0, 0.0]
    assert sum(pool.calls.values()) == 0  # no worker was asked
    assert get_callable_name(reward) == "format_reward" and not is_async_callable(reward)
    pickle.dumps(reward)  # TRL may send reward functions to other processes
    # the prompt's access format decides, as for the conductor reward
    binary = _context(pool, prompt_config=PromptConfig(few_shot=[], positional_access=False))
    (strict,) = get_reward_funcs(["format"], binary)
    positional = workflow_text([1, 0], [TASK.question, "Check it."], [[], [0]])
    assert strict(**_trl_call(1, [positional])) == [0.0]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ([], "unknown reward function"),
        (["accuracy"], "unknown reward function.*'accuracy'.*conductor"),
        (["format", "format"], "named twice"),
        (["conductor", "format"], "use it alone"),
    ],
)
def test_bad_reward_lists_are_refused(names, message):
    with pytest.raises(ValueError, match=message):
        get_reward_funcs(names, _context(FakePool([TASK])))
