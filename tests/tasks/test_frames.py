from __future__ import annotations

from conductor_pipeline.tasks import Task
from conductor_pipeline.tasks.frames import TASK_COLUMNS, tasks_from_frame, tasks_to_frame


def _task(n: int) -> Task:
    return Task(
        id=f"t{n}",
        domain="math",
        difficulty="easy",
        question=f"What is {n} + {n}?",
        answer=str(2 * n),
        answer_format="number",
        verifier="numeric",
        source="test",
        metadata={"n": n, "tags": ["a", "b"]},
    )


def test_a_table_reads_back_as_the_tasks_written():
    tasks = [_task(1), _task(2)]
    frame = tasks_to_frame(tasks)
    assert list(frame.columns) == TASK_COLUMNS
    assert isinstance(frame.loc[0, "metadata"], str)  # stored as JSON text
    assert tasks_from_frame(frame) == tasks


def test_no_tasks_is_an_empty_table_with_the_task_columns():
    frame = tasks_to_frame([])
    assert list(frame.columns) == TASK_COLUMNS
    assert tasks_from_frame(frame) == []
