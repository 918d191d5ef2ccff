"""The async executor, with fake callers that record events (no wall-clock assertions)."""

from __future__ import annotations

import asyncio
import json

from conductor_pipeline.workers.types import FailureKind, Usage, WorkerReply
from conductor_pipeline.workflow import (
    Budget,
    PromptConfig,
    Step,
    Workflow,
    execute_workflow,
)

CFG = PromptConfig()


def subtask_of(messages) -> str:
    return messages[-1]["content"].rsplit("Your subtask:\n", 1)[1]


class FakeCaller:
    """Replies "answer to <subtask>"; records (event, subtask) pairs in order.

    ``gates`` maps a subtask to an asyncio.Event the call waits on before replying;
    ``script`` maps a subtask to a WorkerReply or an exception to raise.
    """

    def __init__(self, usage=(10, 5, 0.01), gates=None, script=None, on_start=None):
        self.events: list[tuple[str, str]] = []
        self.calls: list[tuple[int, list[dict], int]] = []
        self.usage = usage
        self.gates = gates or {}
        self.script = script or {}
        self.on_start = on_start

    async def __call__(self, worker, messages, sample_index=0):
        sub = subtask_of(messages)
        self.calls.append((worker, messages, sample_index))
        self.events.append(("start", sub))
        if self.on_start:
            self.on_start(sub)
        if sub in self.gates:
            await asyncio.wait_for(self.gates[sub].wait(), timeout=5)  # a guard, not a timing check
        else:
            await asyncio.sleep(0)
        self.events.append(("end", sub))
        outcome = self.script.get(sub)
        if isinstance(outcome, BaseException):
            raise outcome
        if isinstance(outcome, WorkerReply):
            return outcome
        p, c, cost = self.usage
        return WorkerReply(worker=f"w{worker}", text=f"answer to {sub}", usage=Usage(p, c, cost))


def chain(n):
    return Workflow([Step(i % 2, f"s{i}", (i - 1,) if i else ()) for i in range(n)])


async def test_independent_steps_overlap_and_aggregator_waits():
    wf = Workflow([Step(0, "A"), Step(1, "B"), Step(2, "C", (0, 1))])
    both_started = asyncio.Event()
    started: set[str] = set()

    def on_start(sub):
        started.add(sub)
        if {"A", "B"} <= started:
            both_started.set()

    caller = FakeCaller(gates={"A": both_started, "B": both_started}, on_start=on_start)
    result = await execute_workflow(wf, "q", caller, config=CFG)
    ev = caller.events
    assert all(r.failure is None for r in result.steps), [r.error for r in result.steps]
    # both A and B started before either finished
    first_end = min(ev.index(("end", "A")), ev.index(("end", "B")))
    assert ev.index(("start", "A")) < first_end and ev.index(("start", "B")) < first_end
    # C started only after both finished
    assert ev.index(("start", "C")) > max(ev.index(("end", "A")), ev.index(("end", "B")))
    recs = result.steps
    assert recs[2].started_at >= max(recs[0].finished_at, recs[1].finished_at)
    assert result.answer == "answer to C" and result.answer_step == 2
    # C saw both earlier steps' responses
    c_msg = caller.calls[2][1][0]["content"]
    assert "answer to A" in c_msg and "answer to B" in c_msg


async def test_chain_runs_in_order():
    caller = FakeCaller()
    result = await execute_workflow(chain(4), "q", caller, config=CFG)
    assert caller.events == [(e, f"s{i}") for i in range(4) for e in ("start", "end")]
    assert result.calls == 4 and result.answer == "answer to s3"
    assert result.tokens == 60 and result.prompt_tokens == 40 and result.completion_tokens == 20
    assert abs(result.cost_usd - 0.04) < 1e-12
    assert result.stopped_by is None and result.infra_failures == 0


async def test_budget_max_steps():
    caller = FakeCaller()
    result = await execute_workflow(chain(3), "q", caller, config=CFG, budget=Budget(max_steps=2))
    assert result.stopped_by == "max_steps"
    assert [r.skipped_reason for r in result.steps] == [None, None, "max_steps"]
    assert result.steps[2].started_at is None and result.calls == 2
    assert result.answer == "answer to s1" and result.answer_step == 1


async def test_budget_max_tokens_skips_what_the_budget_cannot_hold():
    caller = FakeCaller(usage=(10, 5, 0.0))
    result = await execute_workflow(chain(4), "q", caller, config=CFG, budget=Budget(max_tokens=20))
    # the first step's prompt alone is estimated above 20 tokens: no call is made
    assert result.stopped_by == "max_tokens" and result.calls == 0 and caller.calls == []
    assert [r.skipped_reason for r in result.steps] == ["max_tokens"] * 4


async def test_budget_max_cost():
    caller = FakeCaller(usage=(1, 1, 0.5))
    result = await execute_workflow(
        chain(3), "q", caller, config=CFG, budget=Budget(max_cost_usd=0.5)
    )
    assert result.stopped_by == "max_cost_usd"
    assert [r.skipped_reason for r in result.steps] == [None, "max_cost_usd", "max_cost_usd"]
    assert result.calls == 1 and result.answer == "answer to s0"


async def test_dependants_of_skipped_steps_are_skipped():
    wf = Workflow([Step(0, "A"), Step(0, "B"), Step(0, "C", (1,))])
    caller = FakeCaller()
    result = await execute_workflow(wf, "q", caller, config=CFG, budget=Budget(max_steps=1))
    assert [r.skipped_reason for r in result.steps] == [None, "max_steps", "max_steps"]
    assert [s for e, s in caller.events if e == "start"] == ["A"]


async def test_failure_falls_back_to_last_answer_and_dependants_see_no_response():
    failing = WorkerReply(
        worker="w1",
        text=None,
        failure=FailureKind.TIMEOUT,
        error="timed out after 30s",
        usage=Usage(3, 0, 0.0),
    )
    caller = FakeCaller(script={"s2": failing})
    result = await execute_workflow(chain(3), "q", caller, config=CFG)
    rec = result.steps[2]
    assert rec.failure == "timeout" and rec.error == "timed out after 30s" and rec.response is None
    assert result.answer == "answer to s1" and result.answer_step == 1
    assert result.infra_failures == 1 and result.calls == 3

    caller = FakeCaller(script={"s1": failing})
    result = await execute_workflow(chain(3), "q", caller, config=CFG)
    assert result.steps[2].response == "answer to s2"
    assert "(no response)" in caller.calls[2][1][0]["content"]


async def test_blank_last_response_falls_back():
    caller = FakeCaller(script={"s1": WorkerReply(worker="w", text="   ")})
    result = await execute_workflow(chain(2), "q", caller, config=CFG)
    assert result.answer == "answer to s0" and result.answer_step == 0
    assert result.infra_failures == 0


async def test_exception_in_caller_is_recorded_not_raised():
    caller = FakeCaller(script={"s1": RuntimeError("connection reset")})
    result = await execute_workflow(chain(3), "q", caller, config=CFG)
    rec = result.steps[1]
    assert rec.failure == "provider_error" and "RuntimeError: connection reset" in rec.error
    assert result.steps[2].response == "answer to s2"
    assert result.infra_failures == 1


async def test_non_reply_is_malformed():
    async def bad_caller(worker, messages, sample_index=0):
        return "just a string"

    result = await execute_workflow(chain(1), "q", bad_caller, config=CFG)
    assert result.steps[0].failure == "malformed_reply" and result.answer == ""
    assert result.answer_step is None


async def test_all_failed_gives_empty_answer():
    caller = FakeCaller(script={"s0": ValueError("x"), "s1": ValueError("y")})
    result = await execute_workflow(chain(2), "q", caller, config=CFG)
    assert result.answer == "" and result.answer_step is None and result.infra_failures == 2


async def test_names_sample_index_and_json():
    caller = FakeCaller()
    result = await execute_workflow(
        chain(2), "q", caller, config=CFG, worker_names=["sim-a", "sim-b"], sample_index=7
    )
    assert [r.worker_name for r in result.steps] == ["sim-a", "sim-b"]
    assert all(c[2] == 7 for c in caller.calls)
    d = json.loads(json.dumps(result.to_dict()))
    assert d["answer"] == "answer to s1" and d["steps"][1]["access"] == [0]
    assert d["steps"][0]["tokens"] == 15 and d["calls"] == 2
    # without names, the reply's worker name is used
    result = await execute_workflow(chain(1), "q", FakeCaller(), config=CFG)
    assert result.steps[0].worker_name == "w0"


async def test_empty_workflow_and_default_config():
    result = await execute_workflow(Workflow([]), "q", FakeCaller())
    assert result.answer == "" and result.calls == 0 and result.steps == []


async def test_question_reaches_workers_only_when_configured():
    caller = FakeCaller()
    await execute_workflow(chain(1), "SECRET QUESTION", caller, config=PromptConfig())
    assert "SECRET QUESTION" not in caller.calls[0][1][0]["content"]
    caller = FakeCaller()
    await execute_workflow(
        chain(1), "SECRET QUESTION", caller, config=PromptConfig(question_to_workers=True)
    )
    assert "SECRET QUESTION" in caller.calls[0][1][0]["content"]


async def test_cancellation_propagates():
    gate = asyncio.Event()
    caller = FakeCaller(gates={"s0": gate})
    task = asyncio.create_task(execute_workflow(chain(2), "q", caller, config=CFG))
    await asyncio.sleep(0.01)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    else:  # pragma: no cover
        raise AssertionError("expected cancellation")
    assert ("start", "s1") not in caller.events
