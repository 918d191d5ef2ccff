"""Task tables: the splits are stored as tables with one :meth:`Task.to_record` row a task."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from conductor_pipeline.tasks.types import Task

__all__ = ["TASK_COLUMNS", "tasks_from_frame", "tasks_to_frame"]

TASK_COLUMNS = list(Task.__dataclass_fields__)


def tasks_from_frame(frame: pd.DataFrame) -> list[Task]:
    """The tasks of a table written by :func:`tasks_to_frame`, in row order."""
    return [Task.from_record(row) for row in frame.to_dict(orient="records")]


def tasks_to_frame(tasks: Iterable[Task]) -> pd.DataFrame:
    """One row a task (``metadata`` as JSON text); an empty table keeps the columns."""
    return pd.DataFrame([task.to_record() for task in tasks], columns=TASK_COLUMNS)
