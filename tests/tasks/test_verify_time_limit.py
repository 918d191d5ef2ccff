"""Every verifier call ends within its time limit and never holds the process.

math-verify (sympy) can parse a short answer such as ``10^{10^{10}}`` for hours while it
holds the GIL; off the main thread its own SIGALRM limit is off, so before the verifiers
that parse expressions ran in child processes, one such answer froze the whole process:
training's scorer and evaluation both call ``verify`` through ``asyncio.to_thread``.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conductor_pipeline.evaluation.systems import judge as evaluation_judge
from conductor_pipeline.tasks import Task, verify
from conductor_pipeline.tasks.judge_pool import JudgePool, time_limit_s
from conductor_pipeline.training.configs import RewardConfig
from conductor_pipeline.training.scoring import score_rollout
from conductor_pipeline.workers.types import Usage, WorkerReply
from conductor_pipeline.workflow import PromptConfig

LIMIT_S = 2.0
TOWER = r"\boxed{10^{10^{10}}}"

MATH = Task(
    id="m",
    domain="math",
    difficulty="easy",
    question="What is 2 + 3?",
    answer="5",
    answer_format="math",
    verifier="math",
    source="unit-test",
)

PATHOLOGICAL = {
    "tower of powers": TOWER,
    "python power tower": r"\boxed{9**9**9}",
    "deep nesting": r"\boxed{" + "(" * 600 + "1" + ")" * 600 + "}",
    "one megabyte": r"\boxed{" + "9" * 1_000_000 + "}",
}


@pytest.fixture(autouse=True)
def _short_limit(monkeypatch):
    monkeypatch.setenv("CONDUCTOR_VERIFY_TIME_LIMIT_S", str(LIMIT_S))


def test_a_worker_thread_does_not_freeze_the_process():
    # in a process of its own: on the code before the fix this child never ends, and the
    # timeout below turns that into a failure instead of a hung test session
    script = (
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from conductor_pipeline.tasks import Task, verify\n"
        "t = Task(id='m', domain='math', difficulty='easy', question='q', answer='5',\n"
        "         answer_format='math', verifier='math', source='unit-test')\n"
        "with ThreadPoolExecutor(1) as ex:\n"
        f"    print(ex.submit(verify, t, {TOWER!r}).result().reason)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert f"time limit of {LIMIT_S:g} s" in done.stdout


@pytest.mark.parametrize("answer", list(PATHOLOGICAL.values()), ids=list(PATHOLOGICAL))
def test_pathological_answers_are_wrong_from_a_worker_thread(answer):
    with ThreadPoolExecutor(1) as ex:
        verdict = ex.submit(verify, MATH, answer).result(timeout=60)
    assert not verdict.correct and verdict.score == 0.0


def test_the_reason_names_the_limit_and_the_pool_recovers():
    with ThreadPoolExecutor(1) as ex:
        stopped = ex.submit(verify, MATH, TOWER).result(timeout=60)
    assert stopped.reason == f"verification stopped at its time limit of {LIMIT_S:g} s"
    # the stuck child was killed; the next call gets a fresh one and judges normally
    assert verify(MATH, r"\boxed{5}").correct


def test_a_pathological_reference_answer_is_bounded_too():
    task = Task(**{**MATH.__dict__, "answer": "10^{10^{10}}"})
    verdict = verify(task, r"\boxed{7}")
    assert not verdict.correct and "time limit" in verdict.reason


async def test_the_training_scorer_scores_it_wrong():
    async def caller(worker, messages, sample_index=0, **_):
        return WorkerReply("sim-x", f"The answer is {TOWER}", Usage(prompt_tokens=1))

    text = "model_id = [0]\nsubtasks = ['Solve it.']\naccess_list = [[]]"
    config = RewardConfig(retry_delay_s=0.0)
    score = await score_rollout(text, MATH, caller, 1, None, PromptConfig(few_shot=[]), config)
    assert score.correct is False and score.reward == config.wrong
    assert "time limit" in (score.verdict or "")


async def test_evaluation_judges_it_wrong():
    verdict = await evaluation_judge(MATH, TOWER)
    assert not verdict.correct and "time limit" in verdict.reason


def test_a_dead_child_is_a_wrong_answer_with_the_reason():
    pool = JudgePool(max_children=1)
    try:
        assert pool.judge(MATH, r"\boxed{5}", LIMIT_S)[0] is True  # starts the one child
        child = pool.idle.get_nowait()  # idle, waiting for the next judgement: kill it
        child.process.kill()
        child.process.wait()
        pool.idle.put(child)
        verdict = pool.judge(MATH, r"\boxed{5}", LIMIT_S)
        assert verdict[0] is False and "process died" in verdict[3]
        assert pool.judge(MATH, r"\boxed{5}", LIMIT_S)[0] is True
    finally:
        pool.close()


def test_the_limit_is_validated(monkeypatch):
    monkeypatch.setenv("CONDUCTOR_VERIFY_TIME_LIMIT_S", "soon")
    with pytest.raises(ValueError, match="CONDUCTOR_VERIFY_TIME_LIMIT_S"):
        time_limit_s()
    monkeypatch.setenv("CONDUCTOR_VERIFY_TIME_LIMIT_S", "0")
    with pytest.raises(ValueError, match="above 0"):
        time_limit_s()
