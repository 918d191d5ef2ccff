"""Does the sandbox know a question? The simulated ``sim-*`` workers run no model: they can
only answer the prepared tasks loaded by the sandbox server (see ``simulated.py``). Asked
anything else, they reply with plausible but made-up answers, so a caller has to be told.

* :func:`recognise` decides it on the server's :class:`TaskIndex` (``POST /sandbox/recognise``);
* :class:`SandboxQuestionCheck` asks a running sandbox server, for ``conductor ask`` and the
  Conductor API (``open_worker_pool`` attaches one to a sandbox pool with simulated workers).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conductor_pipeline.workers.sandbox.profiles import SIM_PREFIX
from conductor_pipeline.workers.sandbox.simulated import RECOGNISED_SHARE, TaskIndex

if TYPE_CHECKING:
    from conductor_pipeline.workflow.orchestrator import OrchestrationResult

log = logging.getLogger(__name__)

RECOGNISE_PATH = "/sandbox/recognise"

# ASCII only: the text also travels as an HTTP header (X-Conductor-Warning).
UNKNOWN_QUESTION_WARNING = (
    "This question is not one of the sandbox's prepared tasks. The simulated sim-* workers "
    "only know those, so their answer to it is made up. Ask a prepared question "
    "(`conductor ask --sample` draws one), or configure real workers "
    '(docs/sandbox.md, "Adding a real provider").'
)


@dataclass(frozen=True)
class QuestionCheck:
    """What the sandbox knows about a question.

    ``known``: a prepared task's question occurs in it whole (case, spacing and a final
    full stop or question mark aside). ``task_id`` and ``coverage`` (the share of the task's
    6-grams present) describe the best matching task, if any.
    """

    known: bool
    task_id: str | None = None
    coverage: float = 0.0

    @property
    def warning(self) -> str | None:
        """The notice to show the person asking, or None for a known question."""
        return None if self.known else UNKNOWN_QUESTION_WARNING

    def to_dict(self) -> dict[str, object]:
        return {"known": self.known, "task_id": self.task_id, "coverage": self.coverage}


def recognise(index: TaskIndex, text: str) -> QuestionCheck:
    """Whether ``text`` holds one of the prepared tasks in ``index`` whole.

    Stricter than a simulated worker, which answers a task once 60 % of its 6-grams are
    visible: "How many 1 bits are in the number 12345?" shares most 6-grams with a prepared
    question about another number, and the workers would give that task's answer. Only a
    question found word for word gets an answer that is really its own.
    """
    matches = index.scan(text, min_coverage=RECOGNISED_SHARE)
    if not matches:
        return QuestionCheck(known=False)
    # 6-grams keep words and operators but drop other punctuation (a decimal point, a
    # comma in a number): a whole match must also hold the question's characters, and not
    # run on into a longer number ("Calculate 9 * 3.5" is not "Calculate 9 * 3.")
    compact = _compact(text)
    for match in matches:
        whole = re.escape(_compact(match.task.question).rstrip(".?!")) + _NUMBER_GOES_ON
        if match.coverage >= 1.0 and re.search(whole, compact):
            return QuestionCheck(known=True, task_id=match.task.id, coverage=1.0)
    best = matches[0]
    return QuestionCheck(known=False, task_id=best.task.id, coverage=round(best.coverage, 4))


def is_simulated_worker(name: str | None) -> bool:
    """Whether ``name`` is one of the sandbox's simulated ``sim-*`` workers."""
    return bool(name) and str(name).startswith(SIM_PREFIX)


def answered_by_simulated_worker(result: OrchestrationResult) -> bool:
    """Whether a simulated worker answered some step of ``result``, in any round (an
    earlier round's answers reach the Conductor's next workflow)."""
    return any(
        step.ok and is_simulated_worker(step.worker_name)
        for r in result.rounds
        if r.execution is not None
        for step in r.execution.steps
    )


def simulation_marks(result: OrchestrationResult, check: QuestionCheck | None) -> dict[str, Any]:
    """The marks ``conductor ask --json`` and the API's ``conductor`` record share:
    ``simulated`` (a simulated worker answered some step, so the answer is no real model's),
    ``sandbox_known_question`` (None without a check: a pool of real workers, or a sandbox
    that could not say) and ``warning`` (set when the simulated workers made the answer up:
    the question is none of the prepared tasks)."""
    return {
        "simulated": answered_by_simulated_worker(result),
        "sandbox_known_question": check.known if check is not None else None,
        "warning": check.warning if check is not None else None,
    }


# after a question found whole: not a digit, nor a decimal point or comma and a digit
_NUMBER_GOES_ON = r"(?!\d|[.,]\d)"


def _compact(text: str) -> str:
    """Lower case without whitespace: spacing and case may differ, symbols may not."""
    return "".join(text.lower().split())


class SandboxQuestionCheck:
    """Asks a sandbox server at ``url`` (``http://127.0.0.1:<port>``) whether it knows a
    question. Awaiting it returns a :class:`QuestionCheck`, or None when the server could not
    say (the request failed): a notice must never fail the question itself."""

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"SandboxQuestionCheck({self.url!r})"

    async def __call__(self, question: str) -> QuestionCheck | None:
        import httpx

        try:
            # plain http on loopback: verify=False only skips loading the CA bundle, which
            # made each check cost ~25 ms instead of ~2 ms
            async with httpx.AsyncClient(timeout=self.timeout_s, verify=False) as client:
                response = await client.post(f"{self.url}{RECOGNISE_PATH}", json={"text": question})
            response.raise_for_status()
            body = response.json()
            return QuestionCheck(
                known=bool(body["known"]),
                task_id=body.get("task_id"),
                coverage=float(body.get("coverage") or 0.0),
            )
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.warning("the sandbox could not say whether it knows the question: %s", exc)
            return None
