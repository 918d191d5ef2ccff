"""``simulated`` in ``conductor ask --json`` and the API's record: a simulated ``sim-*``
worker answered some step, in any round; a step it failed or never ran does not count."""

from __future__ import annotations

from conductor_pipeline.workers.sandbox.questions import QuestionCheck, simulation_marks
from conductor_pipeline.workflow.executor import ExecutionResult, StepRecord
from conductor_pipeline.workflow.orchestrator import OrchestrationResult, RoundRecord


def _result(*rounds: list[StepRecord]) -> OrchestrationResult:
    records = [
        RoundRecord(i, None, ExecutionResult("a", 0, steps=list(steps)))
        for i, steps in enumerate(rounds)
    ]
    return OrchestrationResult("q", "a", records, [], False, 0.0)


def _step(name: str, **outcome) -> StepRecord:
    return StepRecord(0, 0, name, "subtask", (), **({"response": "5"} | outcome))


def test_a_step_answered_by_a_simulated_worker_marks_the_answer():
    prepared = QuestionCheck(known=True)
    marks = simulation_marks(_result([_step("gpt-real"), _step("sim-abacus")]), prepared)
    assert marks == {"simulated": True, "sandbox_known_question": True, "warning": None}
    # an earlier round's simulated answer reached the final workflow too
    assert simulation_marks(_result([_step("sim-sage")], [_step("gpt-real")]), None)["simulated"]


def test_real_workers_failed_or_skipped_simulated_steps_and_no_workflow_are_not_simulated():
    failed = _step("sim-sage", response=None, failure="timeout")
    skipped = _step("sim-sage", response=None, skipped_reason="max_steps")
    assert simulation_marks(_result([_step("gpt-real"), failed, skipped]), None) == {
        "simulated": False,
        "sandbox_known_question": None,
        "warning": None,
    }
    unknown = simulation_marks(_result(), QuestionCheck(known=False))
    assert unknown["simulated"] is False and unknown["warning"]
