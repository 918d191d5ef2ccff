"""The workflow records: a Conductor's plan as data.

A workflow is an ordered list of steps. Step ``i`` names a worker by its position in the
pool, the subtask written for that worker, and ``access``: the *resolved* positions of the
earlier steps whose subtask and response the worker is shown. Because every position in
``access`` is smaller than ``i``, the steps always form a DAG in topological order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

AccessPattern = Literal["empty", "single", "chain", "independent", "tree"]


class WorkflowParseError(ValueError):
    """A Conductor completion (or list triple) does not describe a valid workflow.

    The message says what is wrong, e.g. ``access_list[2] refers to step 3, which is not
    earlier than step 2``.
    """


class UnequalListsError(WorkflowParseError):
    """The three lists were read but differ in length: the Conductor lost count of its
    steps. Training counts these on their own (a warm start that writes many of them
    cannot teach GRPO multi-step workflows)."""


@dataclass(frozen=True)
class ParseLimits:
    """Size limits applied by the parser (defaults follow the paper's 5-step cap)."""

    max_steps: int = 5
    max_subtask_chars: int = 4000
    max_text_chars: int = 50_000


@dataclass(frozen=True)
class Step:
    """One workflow step.

    ``worker`` is the worker's position in the pool; ``subtask`` is stripped of surrounding
    whitespace and never empty; ``access`` is a sorted tuple of distinct earlier step
    positions (a list is accepted and converted).

    ``all_access`` records that the Conductor wrote ``"all"`` for this step (``access`` is
    then every earlier position, none for step 0). Within one round that is the same as
    listing those positions, but in a recursion round ``"all"`` also shows the previous
    round's steps (the paper's behaviour), so the parser keeps the distinction here. It is
    left out of equality, so a workflow compares equal to its rendered-and-parsed copy.
    """

    worker: int
    subtask: str
    access: tuple[int, ...] = ()
    all_access: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.worker, bool) or not isinstance(self.worker, int) or self.worker < 0:
            raise ValueError(f"Step.worker must be a non-negative int, got {self.worker!r}")
        if not isinstance(self.subtask, str):
            raise ValueError(f"Step.subtask must be a str, got {type(self.subtask).__name__}")
        subtask = self.subtask.strip()
        if not subtask:
            raise ValueError("Step.subtask must not be empty")
        if subtask is not self.subtask:
            object.__setattr__(self, "subtask", subtask)
        access = self.access
        if not isinstance(access, tuple):
            access = tuple(access)
        for j in access:
            if isinstance(j, bool) or not isinstance(j, int) or j < 0:
                raise ValueError(f"Step.access entries must be non-negative ints, got {j!r}")
        if any(a >= b for a, b in zip(access, access[1:], strict=False)):
            access = tuple(sorted(set(access)))
        object.__setattr__(self, "access", access)
        if not isinstance(self.all_access, bool):
            raise ValueError(f"Step.all_access must be a bool, got {self.all_access!r}")


@dataclass
class Workflow:
    """An ordered sequence of steps (``steps`` is a list of :class:`Step`).

    Construction checks that every access entry points to an earlier step, so a
    ``Workflow`` is always executable. An empty workflow is the "keep the previous answer"
    action of a recursion round.
    """

    steps: list[Step] = field(default_factory=list)

    def __post_init__(self) -> None:
        steps = list(self.steps)
        for i, step in enumerate(steps):
            if not isinstance(step, Step):
                raise ValueError(f"Workflow.steps[{i}] is {type(step).__name__}, not Step")
            if step.access and step.access[-1] >= i:
                raise ValueError(
                    f"step {i} may only see earlier steps, but its access is {list(step.access)}"
                )
            if step.all_access and step.access != tuple(range(i)):
                raise ValueError(
                    f"step {i} is marked all_access, so its access must be every earlier "
                    f"step {list(range(i))}, not {list(step.access)}"
                )
        self.steps = steps

    # -- container helpers -------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __getitem__(self, index: int) -> Step:
        return self.steps[index]

    @property
    def is_empty(self) -> bool:
        return not self.steps

    @property
    def workers(self) -> list[int]:
        return [s.worker for s in self.steps]

    @property
    def subtasks(self) -> list[str]:
        return [s.subtask for s in self.steps]

    @property
    def access_lists(self) -> list[list[int]]:
        return [list(s.access) for s in self.steps]

    # -- structure -----------------------------------------------------------------------
    def access_pattern(self) -> AccessPattern:
        """Classify how the steps see each other.

        - ``"empty"``: no steps (the recursion "keep the answer" action).
        - ``"single"``: exactly one step.
        - ``"chain"``: two or more steps and every step ``i >= 1`` sees at least its
          immediate predecessor ``i - 1`` (it may see older steps too, so ``"all"``
          everywhere is a chain). The steps necessarily run one after another.
        - ``"independent"``: two or more steps and no step sees any other; all can run in
          parallel (e.g. ``[[], []]``).
        - ``"tree"``: anything else, i.e. two or more steps where some step sees earlier
          steps (fan-in) but at least one step ``i >= 1`` does not see step ``i - 1``,
          e.g. ``[[], [], "all"]`` (two parallel attempts, then an aggregator). Strictly
          this is a DAG; the paper calls these trees.
        """
        n = len(self.steps)
        if n == 0:
            return "empty"
        if n == 1:
            return "single"
        if all(not s.access for s in self.steps):
            return "independent"
        if all((i - 1) in s.access for i, s in enumerate(self.steps) if i > 0):
            return "chain"
        return "tree"

    def depth(self) -> int:
        """Number of steps on the longest dependency path (0 for an empty workflow).

        With parallel execution the wall-clock time is roughly ``depth`` calls, not
        ``len(workflow)`` calls.
        """
        levels: list[int] = []
        for s in self.steps:
            levels.append(1 + max((levels[j] for j in s.access), default=0))
        return max(levels, default=0)

    # -- conversions ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The three lists, JSON-friendly (access as resolved position lists)."""
        return {
            "model_id": self.workers,
            "subtasks": self.subtasks,
            "access_list": self.access_lists,
        }

    @classmethod
    def from_steps(cls, steps: Iterable[Step]) -> Workflow:
        return cls(list(steps))
