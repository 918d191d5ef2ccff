"""What a GRPO stage reports while it runs: curated metrics per step
(:class:`MetricsCallback`), a few rollouts per step for the training report
(:class:`RolloutSampleLog`), and one short line instead of TRL's warning for a masked
rollout (:func:`install_log_filter`)."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

from conductor_pipeline.training.rewards import ScoredBatch
from conductor_pipeline.training.rollout_stats import RolloutStats

__all__ = ["LogMetrics", "MetricsCallback", "RolloutSampleLog", "install_log_filter"]

log = logging.getLogger(__name__)

LogMetrics = Callable[[dict[str, float], int], None]


class RolloutSampleLog:
    """Appends a few rollouts per step to a JSONL file (``stage``, ``step``, ``question``,
    ``completion``, ``reward``, ``parsed``, ``masked``, ``correct``, ``workers``), for the
    training report's early-vs-late examples. ``per_step`` rows, one per group (the
    batch holds groups of ``group_size`` rollouts of one prompt): the first rollout of each
    group, so the rows show as many questions as they can."""

    def __init__(
        self,
        path: Path,
        stage: str,
        *,
        per_step: int = 4,
        step_offset: int = 0,
        group_size: int = 1,
    ) -> None:
        self.path = path
        self.stage = stage
        self.per_step = per_step
        self.step_offset = step_offset
        self.group_size = max(int(group_size), 1)

    def forget_after(self, step: int) -> None:
        """Drop this stage's rows after ``step`` (they are recomputed after a resume)."""
        if not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row.get("stage") == self.stage and row.get("step", 0) > step:
                continue
            kept.append(line)
        self.path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")

    def __call__(self, batch: ScoredBatch) -> None:
        if batch.step is None or not batch.scores:
            return
        rows = []
        for i in list(range(0, len(batch.scores), self.group_size))[: self.per_step]:
            score = batch.scores[i]
            rows.append(
                {
                    "stage": self.stage,
                    "step": self.step_offset + batch.step,
                    "question": batch.tasks[i].question,
                    "completion": batch.texts[i],
                    "reward": score.reward,
                    "parsed": score.parsed,
                    "masked": score.masked,
                    "correct": score.correct,
                    "workers": score.workers,
                }
            )
        with self.path.open("a", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")


# TRL log keys worth keeping, with the names they get.
_TRL_KEYS = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "learning_rate",
    "kl": "kl",
    "entropy": "entropy",
    "completions/mean_length": "completions/mean_length",
    "completions/clipped_ratio": "completions/clipped_ratio",
    "frac_reward_zero_std": "reward/frac_zero_std_groups",
    "clip_ratio/region_mean": "clip_ratio",
    "step_time": "step_time_s",
}


def _trainer_callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class MetricsCallback(_trainer_callback_base()):  # type: ignore[misc]
    """Every logged step: curated TRL numbers + rollout statistics → ``log_metrics``.

    Names are ``<prefix><metric>`` (e.g. ``grpo/reward/mean``, ``grpo/workers/share/sim-sage``,
    ``grpo/tokens_per_s``); the step is ``step_offset + global_step``. Every record is also
    appended to ``history``. Under several processes the rollout statistics cover the
    rollouts of all processes (:meth:`RolloutStats.drain` gathers them).
    """

    def __init__(
        self,
        stats: RolloutStats,
        log_metrics: LogMetrics | None = None,
        *,
        prefix: str = "grpo/",
        step_offset: int = 0,
        history: list[dict[str, float]] | None = None,
    ) -> None:
        self.stats = stats
        self.log_metrics = log_metrics
        self.prefix = prefix
        self.step_offset = step_offset
        self.history = history if history is not None else []
        self._step_started = time.perf_counter()
        # called on every process with each logged step's rollout metrics and step; what
        # they return joins the step's record (CapsCallback counts the caps here)
        self.observers: list[Callable[[dict[str, float], int], dict[str, float]]] = []

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001
        self._step_started = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
        logs = logs or {}
        if "loss" not in logs and "reward" not in logs:
            return  # the end-of-training summary, not a step
        # every process drains (the rollouts of all of them are gathered) and tells the
        # observers, so that all processes take the same decisions (training.caps)
        rollout = self.stats.drain()
        step = self.step_offset + int(state.global_step)
        observed: dict[str, float] = {}
        for observe in self.observers:
            observed.update(observe(dict(rollout), step))
        if not getattr(state, "is_world_process_zero", True):
            return  # several processes: only the main one reports
        metrics: dict[str, float] = {}
        for key, name in _TRL_KEYS.items():
            value = logs.get(key)
            if isinstance(value, int | float) and math.isfinite(value):
                metrics[name] = float(value)
        tokens = rollout.pop("rollouts/completion_tokens", 0.0)
        metrics.update(rollout)
        metrics.update(observed)
        seconds = metrics.get("step_time_s") or (time.perf_counter() - self._step_started)
        if seconds > 0 and tokens:
            metrics["tokens_per_s"] = tokens / seconds
        record = {f"{self.prefix}{k}": v for k, v in metrics.items()}
        self.history.append({"step": float(step), **record})
        if self.log_metrics is not None:
            try:
                self.log_metrics(record, step)
            except Exception as exc:  # metrics must never stop training
                log.warning("log_metrics failed at step %d: %s", step, exc)


class _QuietMaskedWarning(logging.Filter):
    """TRL warns with the whole prompt for every masked rollout; keep one short line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("All reward functions returned None"):
            record.msg = "a rollout was masked (infrastructure failure); its advantage is 0"
            record.args = ()
        return True


def install_log_filter() -> None:
    """Shorten TRL's masked-rollout warning (idempotent)."""
    logger = logging.getLogger("trl.trainer.grpo_trainer")
    if not any(isinstance(f, _QuietMaskedWarning) for f in logger.filters):
        logger.addFilter(_QuietMaskedWarning())
