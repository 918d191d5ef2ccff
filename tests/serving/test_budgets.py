"""Per-request budgets bind inside a step, through the API: a worker call is sent
``max_tokens`` capped by what the request's budget has left, a step that does not fit is not
called, recursion stops once the budget is spent, and ``conductor.stopped_by`` names the
limit. The fake pool records the ``max_tokens`` of every call and honours it."""

from __future__ import annotations

from types import SimpleNamespace

from conductor_pipeline.serving.server import BackgroundServer
from conductor_pipeline.serving.settings import RequestLimits
from conductor_pipeline.workers.types import Usage, WorkerReply
from conductor_pipeline.workflow import PolicyCompletion
from conductor_pipeline.workflow.budget import estimate_prompt_tokens
from tests.serving.test_app import ask, make_service, post

WORKER_CAP = 64  # each worker's configured max_tokens, as a pool's specs say


class CapRecordingPool:
    """Answers with ``WORKER_CAP`` completion tokens, or the ``max_tokens`` it is sent when
    that is less; counts prompt tokens as the executor estimates them, so budgets are exact."""

    def __init__(self) -> None:
        self.specs = [
            SimpleNamespace(max_tokens=WORKER_CAP, has_prices=False, model=None) for _ in range(2)
        ]
        self.caps: list[int | None] = []

    async def __call__(self, worker, messages, sample_index=0, **overrides):
        cap = overrides.get("max_tokens")
        self.caps.append(cap)
        prompt = estimate_prompt_tokens(messages)
        completion = WORKER_CAP if cap is None else min(cap, WORKER_CAP)
        return WorkerReply(f"w{worker}", f"answer {len(self.caps)}", Usage(prompt, completion))


class RevisingPolicy:
    """Round 0: two independent steps and one that sees both; every revision: one step."""

    name = "revising"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, messages, *, temperature, max_tokens, seed):
        self.calls += 1
        revising = any("three empty lists" in m["content"] for m in messages)
        if not revising:
            text = (
                "0, 1, 0]\nsubtasks = ['first', 'second', 'combine']\naccess_list = [[], [], 'all']"
            )
        else:
            text = "1]\nsubtasks = ['check again']\naccess_list = ['all']"
        return PolicyCompletion(text, 100, 30, 0.0)


def serve(pool, policy=None):
    service = make_service(policy or RevisingPolicy(), pool, limits=RequestLimits(max_rounds=2))
    return BackgroundServer(service)


def test_max_tokens_1_calls_no_worker_and_says_so():
    pool = CapRecordingPool()
    with serve(pool) as server:
        server.wait_ready()
        response = post(server, ask(max_tokens=1))
    assert response.status_code == 200, response.text
    record = response.json()["conductor"]
    # before the fix one step ran uncapped (about 120 tokens) and stopped_by was null
    assert pool.caps == [] and record["worker_calls"] == 0 and record["tokens"] == 0
    assert record["stopped_by"] == "max_tokens"
    assert [s["skipped_reason"] for s in record["steps"]] == ["max_tokens"] * 3


def test_a_call_is_capped_at_what_the_request_budget_has_left():
    pool = CapRecordingPool()
    with serve(pool) as server:
        server.wait_ready()
        uncapped = post(server, ask()).json()["conductor"]
        assert pool.caps == [None, None, None] and uncapped["stopped_by"] is None
        # room for the two parallel steps and part of the third
        budget = uncapped["tokens"] - 30
        pool.caps.clear()
        record = post(server, ask(max_tokens=budget)).json()["conductor"]
    # the parallel steps fit and go out as without a budget; the last gets what is left
    assert pool.caps == [None, None, WORKER_CAP - 30]
    assert record["steps"][2]["completion_cap"] == WORKER_CAP - 30
    assert record["tokens"] == budget and record["stopped_by"] == "max_tokens"


def test_recursion_stops_once_the_budget_is_spent():
    pool, policy = CapRecordingPool(), RevisingPolicy()
    with serve(pool, policy) as server:
        server.wait_ready()
        free = post(server, ask(max_rounds=1)).json()["conductor"]
        assert [r["steps"] for r in free["rounds"]] == [3, 1] and policy.calls == 2
        # a budget the first round uses up: no revision is asked for, none runs
        policy.calls, spent = 0, free["rounds"][0]["tokens"]
        pool.caps.clear()
        record = post(server, ask(max_rounds=2, max_tokens=spent)).json()["conductor"]
    assert policy.calls == 1 and len(pool.caps) == 3
    assert record["stopped_by"] == "max_tokens"
    assert record["rounds"][1]["steps"] == 0 and "budget spent" in record["rounds"][1]["note"]
    assert len(record["rounds"]) == 2
