"""An assistant prefill is trained as it is served: the policy continues the prefilled turn.

TRL's GRPOTrainer renders a conversational prompt with a new assistant turn after the last
message, so a prompt ending in the prefill (``conductor.prompt.assistant_prefill``) was
closed as a finished turn and the policy sampled a fresh reply after it, which the reward
then parsed without the prefill; evaluation and serving continue the prefill
(``encode_chat``) and parse prefill plus continuation.
"""

from __future__ import annotations

import pytest

from conductor_pipeline.generation.chat import encode_chat
from conductor_pipeline.training.configs import RewardConfig, TrainingConfig
from conductor_pipeline.training.grpo import check_warm_start_prompt
from conductor_pipeline.training.inputs import build_prompt_dataset
from conductor_pipeline.training.rewards import ConductorReward, format_reward
from conductor_pipeline.workflow import PromptConfig, conductor_messages
from conductor_pipeline.workflow.config import prompt_config

from .fakes import FakePool, make_task

PREFILL = "model_id = ["
REST = "0]\nsubtasks = ['What is 2 + 3?']\naccess_list = [[]]"
DESCRIPTIONS = ["Description of sim-good", "Description of sim-bad", "Description of sim-broken"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_a_prefilled_prompt_is_the_text_the_policy_is_served(tokenizer):
    section = {"few_shot": [], "assistant_prefill": PREFILL}
    rows, _ = build_prompt_dataset(
        [make_task(0)], tokenizer, DESCRIPTIONS, prompt_config(section), TrainingConfig()
    )
    prompt = rows[0]["prompt"]
    assert isinstance(prompt, str) and prompt.endswith(PREFILL)
    # TRL tokenizes a text prompt as it is: the same ids evaluation and serving generate from
    messages = conductor_messages(make_task(0).question, DESCRIPTIONS, prompt_config(section))
    served, prefilled = encode_chat(tokenizer, messages)
    assert prefilled
    assert tokenizer(text=[prompt])["input_ids"][0] == served


def test_without_a_prefill_the_prompt_stays_a_conversation(tokenizer):
    rows, _ = build_prompt_dataset(
        [make_task(0)], tokenizer, DESCRIPTIONS, prompt_config({"few_shot": []}), TrainingConfig()
    )
    assert isinstance(rows[0]["prompt"], list) and rows[0]["prompt"][-1]["role"] == "user"


async def test_the_reward_parses_the_prefill_and_the_completion():
    pool = FakePool([make_task(0)])
    reward = ConductorReward(
        pool,
        pool.names,
        pool.descriptions,
        PromptConfig(few_shot=[], assistant_prefill=PREFILL),
        RewardConfig(retry_delay_s=0.0),
    )
    task = make_task(0)
    columns = {k: [v] for k, v in task.to_record().items()}
    (value,) = await reward(["prompt"], [REST], **columns)
    assert value == 1.0  # parsed, sim-good answered right
    assert reward.last_scores[0].parsed


def test_the_format_reward_reads_the_prefill_too():
    config = PromptConfig(few_shot=[], assistant_prefill=PREFILL)
    assert format_reward(["p"], [REST], n_workers=3, prompt_config=config) == [1.0]


def test_the_scripted_warm_start_refuses_a_prefill():
    with pytest.raises(ValueError, match="assistant_prefill"):
        check_warm_start_prompt(PromptConfig(assistant_prefill=PREFILL))
    check_warm_start_prompt(PromptConfig())  # no prefill: accepted
