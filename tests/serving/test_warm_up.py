"""Start-up warm-up and the kept prompt-opening cache of the served Conductor (issue 14,
section 5). Speed is measured in ``make bench ARGS=serving``; these tests check behaviour:
the warm-up runs before /health turns 200, single requests reuse the cached opening, and
the text is the one the uncached path writes for the same seed."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from conductor_pipeline.serving.server import BackgroundServer
from conductor_pipeline.serving.settings import ServingSettings, serving_settings
from conductor_pipeline.workflow.policy import LocalPolicy, ScriptedPolicy
from conductor_pipeline.workflow.prompts import PromptConfig, conductor_messages

from .test_app import ask, make_service, post


class WarmingPolicy(ScriptedPolicy):
    """Records the warm-up; ``release`` holds it open so /health can be seen before."""

    def __init__(self) -> None:
        super().__init__(worker=1)
        self.conversations: list | None = None
        self.release = threading.Event()

    def warm_up(self, conversations):  # noqa: ANN001, ANN201
        self.conversations = conversations
        self.release.wait(30)
        return 7


def test_the_server_warms_the_policy_up_before_it_reports_healthy():
    policy = WarmingPolicy()
    with BackgroundServer(make_service(policy)) as server:
        health = httpx.get(f"{server.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "loading"
        policy.release.set()
        server.wait_ready()
        assert post(server, ask()).status_code == 200
    # two planning prompts for different questions, over the served workers and prompt
    first, second = policy.conversations
    assert first != second
    assert first[0] == second[0]  # the same system message
    service = make_service()
    prompt = service.orchestration.prompt
    assert first == conductor_messages(
        first[1]["content"].rsplit("Question: ", 1)[1], service.descriptions, prompt
    )
    assert first[-1]["content"] == "model_id = ["  # the served prompt config, prefill included


def test_warm_up_can_be_switched_off():
    policy = WarmingPolicy()
    with BackgroundServer(make_service(policy, warm_up=False)) as server:
        server.wait_ready()
    assert policy.conversations is None


def test_warm_up_setting_must_be_a_boolean():
    assert serving_settings({"warm_up": False}).warm_up is False
    assert ServingSettings().warm_up is True
    with pytest.raises(ValueError, match="serving.warm_up"):
        serving_settings({"warm_up": "yes"})


@pytest.fixture(scope="module")
def smollm2() -> LocalPolicy:
    policy = LocalPolicy(torch_threads=1)
    policy.load()
    return policy


def _planning(question: str) -> list[dict[str, str]]:
    return conductor_messages(question, ["a", "b", "c"], PromptConfig(few_shot=[]))


def test_single_requests_reuse_the_warm_prefix_and_write_the_same_text(smollm2):
    from conductor_pipeline.workers.local_model import generate_chat

    questions = ["Compute the sum of 1234 and 4321.", "Are all cats mammals? Yes or No."]
    before = {
        # plain decoding (one token a pass), without the kept opening
        (q, seed): generate_chat(
            smollm2.model, smollm2.tokenizer, _planning(q), 24, 0.7, seed, max_guess=0
        )
        for q, seed in zip(questions, (0, 1), strict=True)
    }
    with pytest.raises(ValueError, match="at least one"):
        smollm2.warm_up([])
    shared = smollm2.warm_up([_planning("What is 2 + 2?"), _planning("Is ice cold?")])
    assert (
        shared >= 32
        and smollm2.engine.prefix is not None
        and len(smollm2.engine.prefix[0]) == shared
    )
    assert smollm2.prefix_hits == 0  # the warm-up's own generation is not counted
    for (question, seed), (text, prompt_tokens, completion_tokens) in before.items():
        got = asyncio.run(
            smollm2.complete(_planning(question), temperature=0.7, max_tokens=24, seed=seed)
        )
        assert (got.text, got.prompt_tokens, got.completion_tokens) == (
            text,
            prompt_tokens,
            completion_tokens,
        )
    assert smollm2.prefix_hits == len(before)
    # a prompt that does not start with the cached opening takes the full path
    other = [{"role": "user", "content": "Say hi."}]
    reference = generate_chat(smollm2.model, smollm2.tokenizer, other, 8, seed=3, max_guess=0)
    got = asyncio.run(smollm2.complete(other, temperature=0.0, max_tokens=8, seed=3))
    assert got.text == reference[0] and smollm2.prefix_hits == len(before)
