"""A killed evaluation resumes from its store and never redoes a finished pair."""

from __future__ import annotations

import asyncio
import contextlib
import json

from conductor_pipeline.evaluation import EvaluationConfig, PolicyUnderTest, ResultStore, evaluate

from .fakes import FakePool, ScriptedConductor, make_tasks

TASKS = make_tasks(4)
SOLO_ONLY = EvaluationConfig.from_params({"systems": ["solo"], "concurrency": 1})


def test_a_complete_store_is_reused_without_any_call(tmp_path):
    path = tmp_path / "results.jsonl"
    config = EvaluationConfig.from_params(
        {"systems": ["conductor", "conductor+recursion", "solo", "moa"]}
    )
    first_pool, second_pool = FakePool(TASKS), FakePool(TASKS)
    first_policy, second_policy = ScriptedConductor(), ScriptedConductor()

    def go(pool, policy):
        return asyncio.run(
            evaluate(
                TASKS,
                pool.view(),
                config,
                conductor=PolicyUnderTest(policy, "v1", "scripted"),
                store=ResultStore(path),
                pool_id="pool-a",
                progress=False,
            )
        )

    first = go(first_pool, first_policy)
    second = go(second_pool, second_policy)
    assert sum(first_pool.calls.values()) > 0 and first_policy.calls > 0
    assert sum(second_pool.calls.values()) == 0 and second_policy.calls == 0
    assert second.info["pairs_run"] == 0
    assert [(r.system, r.question_id, r.correct) for r in first.results] == [
        (r.system, r.question_id, r.correct) for r in second.results
    ]
    # a new Conductor version is evaluated afresh; the baselines are reused
    third_pool, third_policy = FakePool(TASKS), ScriptedConductor()
    third = asyncio.run(
        evaluate(
            TASKS,
            third_pool.view(),
            config,
            conductor=PolicyUnderTest(third_policy, "v2", "scripted v2"),
            store=ResultStore(path),
            pool_id="pool-a",
            progress=False,
        )
    )
    assert third.info["pairs_run"] == 2 * len(TASKS)  # conductor and conductor+recursion
    # both Conductor systems ran their workflows (a real pool would serve the second from its cache)
    assert third_policy.calls > 0 and sum(third_pool.calls.values()) == 2 * len(TASKS)


def test_a_killed_run_resumes_where_it_stopped(tmp_path):
    path = tmp_path / "results.jsonl"
    slow = FakePool(TASKS)
    inner = slow.__call__

    async def slow_call(worker, messages, sample_index=0):
        await asyncio.sleep(0.01)
        return await inner(worker, messages, sample_index)

    async def killed_after(n_lines: int) -> None:
        view = slow.view()
        view.caller = slow_call
        task = asyncio.create_task(
            evaluate(TASKS, view, SOLO_ONLY, store=ResultStore(path), progress=False)
        )
        while not path.exists() or len(path.read_text().splitlines()) < n_lines:
            await asyncio.sleep(0.005)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(killed_after(7))
    done = len(path.read_text().splitlines())
    assert 7 <= done < 3 * len(TASKS)
    # a line cut short by the kill is skipped, and the next append starts on a fresh line
    with path.open("a") as handle:
        handle.write('{"system": "solo:ace", "question_id": "te')
    store = ResultStore(path)
    assert len(store) == done and store.skipped_lines == 1

    again = FakePool(TASKS)
    run = asyncio.run(evaluate(TASKS, again.view(), SOLO_ONLY, store=store, progress=False))
    assert sum(again.calls.values()) == 3 * len(TASKS) - done  # one call per missing pair
    assert run.info["pairs_run"] == 3 * len(TASKS) - done
    assert len(run.results) == 3 * len(TASKS)
    lines = path.read_text().splitlines()
    assert sum(1 for line in lines if _parses(line)) == 3 * len(TASKS)


def test_a_stored_result_for_a_changed_question_is_not_reused(tmp_path):
    path = tmp_path / "results.jsonl"
    asyncio.run(
        evaluate(TASKS, FakePool(TASKS).view(), SOLO_ONLY, store=ResultStore(path), progress=False)
    )
    changed = [t.__class__(**{**t.__dict__, "question": t.question + " Now."}) for t in TASKS[:1]]
    pool = FakePool(changed)
    asyncio.run(evaluate(changed, pool.view(), SOLO_ONLY, store=ResultStore(path), progress=False))
    assert sum(pool.calls.values()) == 3


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True
