"""Infrastructure failures change no answer: failed worker calls are retried; a pair whose
retries ran out is infra-failed, left out of accuracy and run again by the next resume."""

from __future__ import annotations

import asyncio

import pytest

from conductor_pipeline.evaluation import (
    EvaluationConfig,
    PolicyUnderTest,
    ResultStore,
    evaluate,
    results_frame,
    summarise,
)
from conductor_pipeline.evaluation.runner import RetryingCaller
from conductor_pipeline.workers.faults import FaultInjector
from conductor_pipeline.workers.pool import READ_ONLY_MISS
from conductor_pipeline.workers.types import FailureKind, Usage, WorkerReply

from .fakes import FakePool, ScriptedConductor, make_tasks

TASKS = make_tasks(4)
VALIDATION = make_tasks(2, "validation")
EVERY_SYSTEM = [
    "conductor",
    "solo",
    "moa",
    "random-workflow",
    "best-of-n",
    "router",
    "handcrafted",
    "oracle",
]


def _config(**extra) -> EvaluationConfig:
    return EvaluationConfig.from_params(
        {"systems": EVERY_SYSTEM, "retry_delay_s": 0, "concurrency": 2, **extra}
    )


def _run(pool_view, config, store=None):
    return asyncio.run(
        evaluate(
            TASKS,
            pool_view,
            config,
            conductor=PolicyUnderTest(ScriptedConductor(two_steps=True), "v1", "scripted"),
            validation_tasks=VALIDATION,
            store=store,
            pool_id="pool-a",
            progress=False,
        )
    )


def _answers(run) -> dict[tuple[str, str, str], tuple[str, bool, str]]:
    """(system, split, question) -> (answer, correct, variant), for every pair."""
    return {
        (r.system, r.split, r.question_id): (r.answer, r.correct, r.variant) for r in run.results
    }


@pytest.fixture(scope="module")
def clean():
    """The evaluation without any failure: the reference every faulty run must equal."""
    return _run(FakePool(TASKS + VALIDATION).view(), _config())


def test_retried_calls_give_the_answers_of_a_run_without_failures(clean):
    # every third call of every worker times out; each is asked again and answers
    faulty = FakePool(TASKS + VALIDATION, fail={"ace": 3, "mathy": 3, "dud": 3})
    run = _run(faulty.view(), _config(infra_retries=2))
    assert run.info["worker_call_retries"]["recovered"] > 0
    assert run.info["worker_call_retries"]["exhausted"] == 0
    assert run.info["infra_failed_pairs"] == 0
    assert _answers(run) == _answers(clean)
    assert not any(r.infra_failure or r.failed_calls for r in run.results)


def test_seeded_injected_faults_with_retries_change_no_answer(clean):
    """30 % injected faults (above the pool, one draw per call, fixed seed): with enough
    retries every call is eventually answered, and every pair equals the clean run's."""
    inner = FakePool(TASKS + VALIDATION)
    rates = {"timeout": 0.1, "rate_limit": 0.1, "provider_error": 0.1}
    injector = FaultInjector(inner, rates, seed=11)
    view = inner.view()
    view.caller = injector
    run = _run(view, _config(infra_retries=8))
    assert sum(injector.injected.values()) > 10  # faults really happened
    assert run.info["worker_call_retries"]["retried"] == sum(injector.injected.values())
    assert run.info["infra_failed_pairs"] == 0
    assert _answers(run) == _answers(clean)
    clean_summary = summarise(results_frame(clean.results), samples=200)
    faulty_summary = summarise(results_frame(run.results), samples=200)
    columns = ["system", "n", "accuracy", "ci_low", "ci_high", "infra_failures"]
    assert faulty_summary[columns].equals(clean_summary[columns])


def test_exhausted_retries_mark_the_pair_infra_failed_and_resume_runs_it_again(clean, tmp_path):
    store_path = tmp_path / "results.jsonl"
    # no retries: every fourth call of ace fails for good
    broken = FakePool(TASKS + VALIDATION, fail={"ace": 4})
    first = _run(broken.view(), _config(infra_retries=0), ResultStore(store_path))
    failed = {r.key for r in first.results if r.infra_failure}
    assert failed and first.info["infra_failed_pairs"] > 0
    assert first.info["worker_call_retries"]["exhausted"] > 0
    # derived systems inherit the failure of the solo rows they come from
    frame = results_frame(first.results)
    test = frame[frame["split"] == "test"]
    solo_failed = set(test[(test["system"] == "solo:ace") & test["infra_failure"]]["question_id"])
    oracle_failed = set(test[(test["system"] == "oracle") & test["infra_failure"]]["question_id"])
    assert solo_failed and solo_failed <= oracle_failed
    # the summary leaves infra-failed pairs out of n and accuracy and counts them
    summary = summarise(frame, samples=200).set_index("system")
    for system, rows in test.groupby("system"):
        scored = rows[~rows["infra_failure"]]
        assert summary.loc[system, "n"] == len(scored)
        assert summary.loc[system, "infra_failures"] == int(rows["infra_failure"].sum())
        if len(scored):
            assert summary.loc[system, "accuracy"] == pytest.approx(scored["correct"].mean())
    # the infra-failed pairs are stored, but as not done: the resume runs exactly them
    stored = ResultStore(store_path)
    assert all(stored.get(*key).infra_failure for key in failed if key[0] in stored_systems())
    healthy = FakePool(TASKS + VALIDATION)
    second = _run(healthy.view(), _config(infra_retries=0), ResultStore(store_path))
    rerun_stored = {k for k in failed if k[0] in stored_systems()}
    assert second.info["infra_failed_pairs_rerun"] == len(rerun_stored)
    assert second.info["pairs_run"] == len(rerun_stored)
    assert second.info["infra_failed_pairs"] == 0
    # and after it, the table is the clean run's
    assert _answers(second) == _answers(clean)
    # a third run has nothing left to do
    third_pool = FakePool(TASKS + VALIDATION)
    third = _run(third_pool.view(), _config(), ResultStore(store_path))
    assert third.info["pairs_run"] == 0 and sum(third_pool.calls.values()) == 0


def stored_systems() -> set[str]:
    """The systems whose pairs go to the store (router and oracle are derived, not run)."""
    return {"conductor", "moa", "random-workflow", "best-of-n:ace", "handcrafted"} | {
        f"solo:{name}" for name in ("ace", "mathy", "dud")
    }


def test_a_system_error_is_an_infra_failure_run_again_on_resume(tmp_path, clean):
    class Crashing(ScriptedConductor):
        async def complete(self, messages, **kwargs):
            raise ConnectionError("policy server went away")

    config = EvaluationConfig.from_params({"systems": ["conductor", "solo"], "retry_delay_s": 0})
    store_path = tmp_path / "results.jsonl"

    def go(policy):
        return asyncio.run(
            evaluate(
                TASKS,
                FakePool(TASKS).view(),
                config,
                conductor=PolicyUnderTest(policy, "v1", "scripted"),
                store=ResultStore(store_path),
                pool_id="pool-a",
                progress=False,
            )
        )

    first = go(Crashing())
    summary = summarise(results_frame(first.results), samples=200).set_index("system")
    assert summary.loc["conductor", "n"] == 0
    assert summary.loc["conductor", "infra_failures"] == len(TASKS)
    second = go(ScriptedConductor())
    assert second.info["infra_failed_pairs_rerun"] == len(TASKS)
    rows = [r for r in second.results if r.system == "conductor"]
    assert rows and not any(r.infra_failure for r in rows)


class _Scripted:
    """A caller replaying a fixed list of outcomes (``None``: a reply, else a failure)."""

    def __init__(self, outcomes, error="boom"):
        self.outcomes, self.error, self.calls = list(outcomes), error, []

    async def __call__(self, worker, messages, sample_index=0):
        self.calls.append(sample_index)
        kind = self.outcomes.pop(0)
        if kind is None:
            return WorkerReply("w", "The answer is 1.", Usage(), attempts=1)
        return WorkerReply("w", None, Usage(), failure=kind, error=self.error, attempts=3)


def test_retrying_caller_keeps_the_sample_index_and_sums_attempts():
    inner = _Scripted([FailureKind.TIMEOUT, FailureKind.EMPTY_REPLY, None])
    caller = RetryingCaller(inner, retries=3)
    reply = asyncio.run(caller(0, [{"role": "user", "content": "q"}], 5))
    assert reply.ok and reply.attempts == 3 + 3 + 1
    assert inner.calls == [5, 5, 5]
    assert caller.stats == {"retried": 2, "recovered": 1, "exhausted": 0}


def test_retrying_caller_gives_up_after_its_retries_and_skips_read_only_misses():
    inner = _Scripted([FailureKind.RATE_LIMIT] * 3)
    caller = RetryingCaller(inner, retries=2)
    reply = asyncio.run(caller(0, [], 0))
    assert reply.failure is FailureKind.RATE_LIMIT and len(inner.calls) == 3
    assert caller.stats == {"retried": 2, "recovered": 0, "exhausted": 1}
    miss = _Scripted([FailureKind.PROVIDER_ERROR], error=READ_ONLY_MISS)
    assert not asyncio.run(RetryingCaller(miss, retries=5)(0, [], 0)).ok
    assert len(miss.calls) == 1  # replaying a cache cannot recover by asking again


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"infra_retries": -1}, "evaluation.infra_retries"),
        ({"infra_retries": "3"}, "evaluation.infra_retries"),
        ({"retry_delay_s": -0.5}, "evaluation.retry_delay_s"),
        ({"retry_delay_s": True}, "evaluation.retry_delay_s"),
    ],
)
def test_bad_retry_settings_name_the_key(params, message):
    with pytest.raises(ValueError, match=message):
        EvaluationConfig.from_params(params)
