"""When a GRPO run stops by itself (``training.caps``): the masked-rollout rate stayed high,
or the rollouts have spent the worker budget.

:class:`RunCaps` is the bookkeeping (what was spent, how many steps in a row were mostly
masked, why to stop); :class:`CapsCallback` feeds it each logged step's rollout metrics
and, when a cap is reached, has the trainer save a checkpoint of that step and stop.
``train_conductor`` then raises :class:`TrainingStopped` with the reason, so the run ends
with a message instead of registering and evaluating a half-trained adapter.

The spend and the streak are written into the trainer's log history, which each
checkpoint keeps, so a resumed run continues the count instead of starting at $0. The
caps are not part of the run fingerprint: raising one and running again resumes the run.

Several processes: the rollout metrics are gathered over all processes
(:class:`~conductor_pipeline.training.rollout_stats.RolloutStats`), so every process sees
the same numbers and stops at the same step.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conductor_pipeline.training.callbacks import MetricsCallback
from conductor_pipeline.training.configs import CapsSettings

__all__ = ["SPENT_KEY", "STREAK_KEY", "CapsCallback", "RunCaps", "TrainingStopped"]

log = logging.getLogger(__name__)

# names in the trainer's log history (and, with the stage prefix, the MLflow metrics)
SPENT_KEY = "caps/worker_cost_usd"
STREAK_KEY = "caps/masked_streak"


class TrainingStopped(RuntimeError):
    """A ``training.caps`` cap stopped the run; its checkpoint is kept and the message
    says what was reached and how to continue."""


@dataclass
class RunCaps:
    """The caps of one training run, over all its stages.

    ``spent_usd``: worker dollars the run's rollouts have paid; ``masked_streak``: the
    consecutive steps whose masked rate was above ``max_masked_rate``; ``stop_reason``: why
    the run must stop (``None``: it may go on).
    """

    settings: CapsSettings
    spent_usd: float = 0.0
    masked_streak: int = 0
    stop_reason: str | None = None

    def observe(self, rollout: Mapping[str, float], step: int) -> None:
        """Count one step's rollout metrics (``RolloutStats.drain()``); a step without
        new rollouts (an extra update on the same batch) counts for nothing."""
        if not rollout:
            return
        self.spent_usd += float(rollout.get("workflow/cost_usd_sum", 0.0))
        threshold = self.settings.max_masked_rate
        rate = float(rollout.get("rollouts/masked_rate", 0.0))
        if threshold is not None and rate > threshold:
            self.masked_streak += 1
        else:
            self.masked_streak = 0
        if self.stop_reason is not None:
            return
        window = self.settings.masked_rate_window
        if threshold is not None and self.masked_streak >= window:
            self.stop_reason = (
                f"training stopped at step {step}: more than {threshold:.0%} of the rollouts "
                f"were masked (worker calls failed after every retry) for {window} consecutive "
                f"steps (training.caps.max_masked_rate {threshold:g}, masked_rate_window "
                f"{window}; this step: {rate:.0%}), so the steps trained on little or no signal. "
                "Check the workers (`conductor preflight --env gpu`) and run again: training "
                "resumes from the checkpoint of this step."
            )
        elif self.over_budget:
            self.stop_reason = self._budget_reason(f"at step {step}")

    @property
    def over_budget(self) -> bool:
        cap = self.settings.max_worker_cost_usd
        return cap is not None and self.spent_usd >= cap

    def _budget_reason(self, when: str) -> str:
        return (
            f"training stopped {when}: the rollouts have spent ${self.spent_usd:,.2f} on worker "
            f"calls, which reaches training.caps.max_worker_cost_usd "
            f"${self.settings.max_worker_cost_usd:,.2f}. The checkpoint is kept: to continue, "
            "raise the cap (e.g. --params training.caps.max_worker_cost_usd=<dollars>) and run "
            "again; training resumes from it."
        )

    def restore(self, log_history: Sequence[Mapping[str, Any]]) -> None:
        """Continue the count of a resumed stage from its checkpoint's log history; a stage
        that starts afresh keeps what the run's earlier stages counted."""
        for record in reversed(log_history):
            if SPENT_KEY in record:
                self.spent_usd = float(record[SPENT_KEY])
                self.masked_streak = int(record.get(STREAK_KEY, 0))
                return

    def check_budget_left(self) -> None:
        """Raise :class:`TrainingStopped` when the budget is spent before a stage starts
        (a resumed run whose cap was not raised)."""
        if self.over_budget:
            raise TrainingStopped(self._budget_reason("before its next step"))

    def record(self) -> dict[str, float]:
        return {SPENT_KEY: self.spent_usd, STREAK_KEY: float(self.masked_streak)}


def _trainer_callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class CapsCallback(_trainer_callback_base()):  # type: ignore[misc]
    """Applies :class:`RunCaps` to each logged step of ``metrics`` (it observes the step's
    rollout metrics there, so the run's worker spend so far and the masked streak join the
    step's record: ``<prefix>caps/worker_cost_usd``, ``<prefix>caps/masked_streak``); must
    come after ``metrics`` in the trainer's callbacks."""

    def __init__(self, caps: RunCaps, metrics: MetricsCallback) -> None:
        self.caps = caps
        self._observed = False
        metrics.observers.append(self._observe)

    def _observe(self, rollout: dict[str, float], step: int) -> dict[str, float]:
        if not rollout:
            return {}
        self.caps.observe(rollout, step)
        self._observed = True
        return self.caps.record()

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001
        # the resumed checkpoint's state is loaded by now
        self.caps.restore(state.log_history)
        self.caps.check_budget_left()

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
        if not self._observed:
            return
        self._observed = False
        if state.log_history:
            # saved with the checkpoint, read back on resume
            state.log_history[-1].update(self.caps.record())
        if self.caps.stop_reason is not None:
            control.should_save = True  # the checkpoint of this step, to resume from
            control.should_training_stop = True
            if getattr(state, "is_world_process_zero", True):
                log.error("%s", self.caps.stop_reason)
