"""One progress bar per training stage, in place of the trainers' raw log dicts.

transformers' ``Trainer`` adds ``PrinterCallback`` when ``disable_tqdm=True`` (our trainers
run that way) and it prints every log dict — with a fractional ``epoch`` that reads as
progress but is not. :func:`install_progress` removes that printer (and the stock tqdm
``ProgressCallback`` if it is there) and adds :class:`StageProgress`: one bar per stage with
step/total, elapsed and ETA (tqdm's) and the stage's key numbers (SFT: loss; GRPO: reward
mean and parse rate). Only the main process draws it (``accelerate launch`` runs several).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from typing import IO, Any

from conductor_pipeline.distributed import is_main_process

__all__ = ["StageProgress", "install_progress", "sft_postfix", "grpo_postfix"]

# logs of one step (the dict a TrainerCallback's on_log gets) -> the numbers to show
Postfix = Callable[[Mapping[str, Any]], Mapping[str, float]]


def _callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


def sft_postfix(logs: Mapping[str, Any]) -> dict[str, float]:
    """SFT: the step's training loss."""
    loss = logs.get("loss")
    return {"loss": float(loss)} if isinstance(loss, int | float) else {}


def grpo_postfix(history: list[dict[str, float]], prefix: str = "grpo/") -> Postfix:
    """GRPO: reward mean and parse rate of the step, read from the record that
    ``MetricsCallback`` (registered before the bar) has just appended to ``history``;
    TRL's own logs do not carry the parse rate."""

    def postfix(logs: Mapping[str, Any]) -> dict[str, float]:
        if not history:
            return {}
        last = history[-1]
        shown = {
            "reward": last.get(f"{prefix}reward/mean"),
            "parse": last.get(f"{prefix}rollouts/parse_rate"),
        }
        return {k: float(v) for k, v in shown.items() if v is not None}

    return postfix


class StageProgress(_callback_base()):  # type: ignore[misc]
    """A tqdm bar over the stage's optimizer steps (``state.max_steps``)."""

    def __init__(
        self,
        stage: str,
        postfix: Postfix,
        *,
        file: IO[str] | None = None,
        enabled: bool | None = None,
    ) -> None:
        self.stage = stage
        self.postfix = postfix
        self.file = file
        self.enabled = is_main_process() if enabled is None else enabled
        self.bar: Any = None

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001
        if not self.enabled or not getattr(state, "is_world_process_zero", True):
            return
        from tqdm import tqdm  # plain text: a notebook widget needs ipywidgets

        self.bar = tqdm(
            total=int(state.max_steps),
            initial=int(state.global_step),  # a resumed run starts where it stopped
            desc=self.stage,
            unit="step",
            file=self.file if self.file is not None else sys.stderr,
            dynamic_ncols=True,
            mininterval=0,  # steps take seconds: show every one
        )

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
        if self.bar is not None:
            self.bar.update(int(state.global_step) - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
        if self.bar is None or not logs or "train_runtime" in logs:
            return  # the end-of-training summary is not a step
        shown = {k: f"{v:.3g}" for k, v in self.postfix(logs).items() if math.isfinite(float(v))}
        if shown:
            self.bar.set_postfix(shown, refresh=True)

    def on_train_end(self, args, state, control, **kwargs):  # noqa: ANN001
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def install_progress(trainer: Any, stage: str, postfix: Postfix, **kwargs: Any) -> StageProgress:
    """Swap ``trainer``'s printing callbacks for a :class:`StageProgress` bar."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    progress = StageProgress(stage, postfix, **kwargs)
    trainer.add_callback(progress)
    return progress
