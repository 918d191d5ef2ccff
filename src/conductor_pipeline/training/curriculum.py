"""Which training questions the GRPO steps draw: a pass-rate curriculum.

A worker that fails a question fails it again (in the sandbox by rule, for real models by
the paper's Table 7), so a group of rollouts teaches which worker a question needs only
when the workflows it tries end differently on it. On a question the strongest worker gets
right alone, nearly every workflow that gives it the last word is right too: such groups
teach "let the strong worker answer", and nothing about the specialists. On a question it
gets wrong, the reward turns on whether a workflow brought in the worker that can solve it.

So before GRPO a pre-pass asks one reference worker (``curriculum.reference_worker``) every
training question once, alone, and scores its answer with the question's verifier, through
the same reward code as the rollouts. The steps then draw ``unsolved_share`` of their
questions from those it got wrong, the rest from the others (right, or unscored when its
call failed; one domain after the other, as before, with ``grpo.balanced_domains``). It is the pass-rate filtering of RL
data preparation, with one worker's pass as the rate. With ``final_unsolved_share`` the share
moves in a straight line over the steps: a low share first favours workflows that let the
reference answer last (right wherever it is), a higher one later tells apart the workers
that go before it (they matter only where it fails). On real workers it costs one call per
training question, once per run: the verdicts are kept in the run folder, so a resumed run
draws the same questions in the same order.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conductor_pipeline.tasks import Task
from conductor_pipeline.training.configs import CurriculumSettings
from conductor_pipeline.training.rewards import ConductorReward
from conductor_pipeline.workflow import Step, Workflow, render_workflow

__all__ = ["VERDICTS_FILE", "ReferencePass", "curriculum_order", "reference_pass"]

VERDICTS_FILE = "curriculum.json"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReferencePass:
    """The reference worker's verdict per training question id: ``True`` right, ``False``
    wrong, ``None`` not scored (its call failed after every retry)."""

    worker: str
    verdicts: Mapping[str, bool | None]

    @property
    def unsolved(self) -> set[str]:
        return {task_id for task_id, right in self.verdicts.items() if right is False}

    def report(self) -> dict[str, Any]:
        """Counts for the training report and MLflow."""
        values = list(self.verdicts.values())
        return {
            "curriculum_reference": self.worker,
            "curriculum_right": sum(v is True for v in values),
            "curriculum_wrong": sum(v is False for v in values),
            "curriculum_unscored": sum(v is None for v in values),
        }


def reference_pass(
    tasks: Sequence[Task],
    reward: ConductorReward,
    worker: str,
    *,
    saved: Path | None = None,
) -> ReferencePass:
    """Ask ``worker`` each of ``tasks`` once, alone, and score its answers with ``reward``
    (a :class:`ConductorReward` over the training pool).

    ``saved``: a JSON file of an earlier pass of the same run; when it exists and holds
    the same worker and every task, it is read instead of calling the worker again, and
    otherwise it is written.
    """
    if worker not in reward.worker_names:
        raise ValueError(
            f"training.curriculum.reference_worker: {worker!r} is not in the worker pool "
            f"({', '.join(reward.worker_names)})"
        )
    ids = [t.id for t in tasks]
    earlier = _read_verdicts(saved) if saved is not None else None
    if earlier is not None and earlier.worker == worker and set(ids) <= set(earlier.verdicts):
        return ReferencePass(worker, {i: earlier.verdicts[i] for i in ids})
    index = reward.worker_names.index(worker)
    # the question itself as the subtask, as the `solo:` baselines ask it: the worker sees it
    # whether or not the prompt passes the question to workers
    texts = [render_workflow(Workflow([Step(index, task.question, ())])) for task in tasks]
    scores = asyncio.run(reward.score_batch(texts, list(tasks)))
    verdicts: dict[str, bool | None] = {
        task_id: None if score.reward is None else bool(score.correct)
        for task_id, score in zip(ids, scores, strict=True)
    }
    if saved is not None:
        # written whole, then renamed: an interrupted write leaves no half file behind
        partial = saved.with_suffix(".partial")
        partial.write_text(json.dumps({"worker": worker, "verdicts": verdicts}, indent=1))
        partial.replace(saved)
    return ReferencePass(worker, verdicts)


def _read_verdicts(path: Path) -> ReferencePass | None:
    """An earlier pass kept in ``path``, or ``None`` (no file, or one that does not read as
    a pass: it is asked again and overwritten, with a warning)."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return ReferencePass(str(data["worker"]), dict(data["verdicts"]))
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning(
            "curriculum: %s does not read as a reference pass (%s); asking again", path, err
        )
        return None


def curriculum_order(
    rows: Sequence[dict[str, Any]],
    unsolved: set[str],
    settings: CurriculumSettings,
    *,
    prompts_per_step: int,
    balanced_domains: bool,
    seed: int,
    steps: int,
) -> list[dict[str, Any]]:
    """``rows`` (prompt rows with an ``id`` and a ``domain`` column) in the order the steps
    take them: in each step of ``prompts_per_step`` rows, the step's unsolved share
    (:meth:`CurriculumSettings.share_at` over ``steps``, the run's GRPO steps; rounded) of
    the slots hold a question in ``unsolved``, the rest one outside it, while both last.

    The slots that get an unsolved question move on by one each step, so with balanced
    domains every domain gets its share of them; a domain (or the whole split, unbalanced)
    that runs out of one kind gives the other. Every row is kept once.
    """
    rng = random.Random(seed)
    keys = sorted({str(r.get("domain")) for r in rows}) if balanced_domains else ["all"]
    rng.shuffle(keys)
    queues: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
        k: ([], []) for k in keys
    }
    for row in rows:
        key = str(row.get("domain")) if balanced_domains else "all"
        queues[key][0 if str(row["id"]) in unsolved else 1].append(row)
    for hard, easy in queues.values():
        rng.shuffle(hard)
        rng.shuffle(easy)
    ordered: list[dict[str, Any]] = []
    slot = 0
    while len(ordered) < len(rows):
        step, j = divmod(slot, prompts_per_step)
        n_unsolved = round(settings.share_at(step, steps) * prompts_per_step)
        wants_unsolved = (j - step) % prompts_per_step < n_unsolved
        live = [k for k in keys if any(queues[k])]
        hard, easy = queues[live[slot % len(live)]]
        first, second = (hard, easy) if wants_unsolved else (easy, hard)
        ordered.append((first or second).pop())
        slot += 1
    return ordered
