"""Chat messages for the Conductor (planning, recursion) and for the workers it calls.

All wording here is ours. Design choices, briefly:

- Workers are shown to the Conductor as ordinals by default (``worker_info: ordinal``), as in
  the paper: what the Conductor knows about the pool it learns from reward, not from text
  that says which worker is good at what. ``worker_info: description`` shows
  "Worker <n>: <description>" instead; names are never added here (callers pass
  descriptions; keep them free of model names to avoid priors).
- The rules are short; the four built-in worked examples (``DEFAULT_FEW_SHOT``, the GPU
  profile's prompt) roughly triple the prompt, so the sandbox's 135M Conductor, whose
  format the SFT warm start teaches, is prompted without them (``few_shot: []``).
- ``PromptConfig.question_to_workers`` (default ``False``): in our sandbox a worker sees only
  its subtask and the steps its access list shows it, so the Conductor has to write
  self-contained subtasks. ``True`` reproduces the authors' released code, where every
  worker message also carries the original question.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from conductor_pipeline.workflow.parser import parse_workflow, render_workflow
from conductor_pipeline.workflow.types import ParseLimits, Step, Workflow

__all__ = [
    "DEFAULT_FEW_SHOT",
    "FewShotExample",
    "PriorStep",
    "PromptConfig",
    "conductor_messages",
    "recursion_messages",
    "shown_worker_descriptions",
    "worker_messages",
]

# What the Conductor is told about each worker (PromptConfig.worker_info).
WORKER_INFO = ("ordinal", "description")

NO_RESPONSE = "(no response)"


class PriorStep(NamedTuple):
    """A step of the previous round, as a recursion-round worker with "all" access sees it.

    ``response`` is ``None`` when that step failed (shown as "(no response)").
    """

    worker: int
    subtask: str
    response: str | None


@dataclass(frozen=True)
class FewShotExample:
    """A worked example for the Conductor prompt: a question, short reasoning, a workflow.

    ``workflow`` may be a :class:`Workflow` or its text (anything ``parse_workflow`` reads).
    Worker ids are taken modulo the pool size when rendered, so examples stay valid for
    small pools.
    """

    question: str
    workflow: Workflow | str
    reasoning: str = ""

    @classmethod
    def coerce(cls, item: FewShotExample | Mapping[str, Any]) -> FewShotExample:
        if isinstance(item, FewShotExample):
            return item
        wf = item.get("workflow", item.get("workflow_text"))
        if wf is None:
            raise ValueError("a few-shot example needs 'workflow' or 'workflow_text'")
        return cls(str(item["question"]), wf, str(item.get("reasoning", "")))

    def resolved(self, max_steps: int) -> Workflow:
        if isinstance(self.workflow, Workflow):
            return self.workflow
        limits = ParseLimits(max_steps=max(max_steps, 1))
        return parse_workflow(self.workflow, 1_000_000, limits=limits)


# Four worked examples, all outside the benchmarks the Conductor trains and is tested on (as
# the paper's final prompt: a clinical vignette, a harder number-theory count, two
# reach-the-target arithmetic puzzles), so that they teach the format and the shapes of a
# workflow (one step; solve then check; parallel attempts then a comparison) without handing
# over a routing for a benchmark's domain; the paper found in-distribution examples
# encouraged a lazy strategy. Together they use every worker id of a 7-worker pool, so no
# worker looks preferred; ids are taken modulo a smaller pool when rendered. Every access
# list is "all" or [], which both access formats accept.
DEFAULT_FEW_SHOT: tuple[FewShotExample, ...] = (
    FewShotExample(
        question=(
            "Using each of the numbers 4, 6, 25 and 75 at most once, and only +, -, * and /, "
            "write an expression equal to 331."
        ),
        reasoning=(
            "A small search that one worker can finish and check by itself; one step is enough."
        ),
        workflow=Workflow(
            [
                Step(
                    2,
                    "Using each of the numbers 4, 6, 25 and 75 at most once, and only +, -, * "
                    "and /, write an expression equal to 331. Evaluate it step by step to "
                    "confirm the value, then give the expression alone on the last line.",
                ),
            ]
        ),
    ),
    FewShotExample(
        question=(
            "A 58-year-old man has had crushing chest pain for 40 minutes, with sweating and "
            "ST elevation in leads II, III and aVF. Which coronary artery is most likely "
            "blocked, and what is the preferred reperfusion if a catheter lab is 60 minutes "
            "away?"
        ),
        reasoning=(
            "Clinical questions reward a careful second reading: one worker reasons through "
            "the case, another checks that reasoning against the findings and gives the "
            "final answer."
        ),
        workflow=Workflow(
            [
                Step(
                    4,
                    "A 58-year-old man has had crushing chest pain for 40 minutes, with "
                    "sweating and ST elevation in leads II, III and aVF. Name the coronary "
                    "artery most likely blocked and the preferred reperfusion when a catheter "
                    "lab is 60 minutes away. Explain how the ECG leads and the delay lead to "
                    "your answer.",
                ),
                Step(
                    1,
                    "Check the answer above: do the leads point to that artery, and does the "
                    "60-minute delay allow that reperfusion under current guidelines? Correct "
                    "anything wrong and state the artery and the treatment.",
                    (0,),
                    all_access=True,
                ),
            ]
        ),
    ),
    FewShotExample(
        question="How many ordered pairs of positive integers (a, b) satisfy 1/a + 1/b = 1/12?",
        reasoning=(
            "Counting problems are easy to get slightly wrong, so three workers solve it "
            "independently without seeing each other, and a fourth compares their counts "
            "and settles the answer."
        ),
        workflow=Workflow(
            [
                Step(
                    0,
                    "Count the ordered pairs of positive integers (a, b) with 1/a + 1/b = "
                    "1/12. Rewrite the equation as a product, count its solutions, and end "
                    "with the count.",
                ),
                Step(
                    5,
                    "Find how many ordered pairs of positive integers (a, b) satisfy 1/a + "
                    "1/b = 1/12. Justify the count and end with the number.",
                ),
                Step(
                    3,
                    "Solve 1/a + 1/b = 1/12 in positive integers and report how many ordered "
                    "pairs (a, b) there are, listing enough of them to show the pattern.",
                ),
                Step(
                    6,
                    "Three attempts above count the ordered pairs of positive integers with "
                    "1/a + 1/b = 1/12. Compare their methods, find any mistake, and give the "
                    "correct count.",
                    (0, 1, 2),
                    all_access=True,
                ),
            ]
        ),
    ),
    FewShotExample(
        question=(
            "Using each of the numbers 2, 8, 9 and 100 at most once, and only +, -, * and /, "
            "write an expression equal to 818."
        ),
        reasoning=(
            "Puzzles like this are quick to attempt but easy to get subtly wrong (a number "
            "used twice), so one worker solves it and another verifies the rules."
        ),
        workflow=Workflow(
            [
                Step(
                    3,
                    "Using each of the numbers 2, 8, 9 and 100 at most once, and only +, -, * "
                    "and /, write an expression equal to 818. Show its value step by step.",
                ),
                Step(
                    5,
                    "Verify the expression above: it may use only 2, 8, 9 and 100, each at "
                    "most once, with +, -, * and /, and must equal 818. Fix it if it breaks a "
                    "rule, then give the final expression alone on the last line.",
                    (0,),
                    all_access=True,
                ),
            ]
        ),
    ),
)


@dataclass
class PromptConfig:
    """How Conductor and worker prompts are written.

    - ``few_shot``: examples (``FewShotExample`` or dicts with ``question``,
      ``workflow``/``workflow_text`` and ``reasoning``); defaults to ``DEFAULT_FEW_SHOT``.
    - ``question_to_workers``: also show workers the original question (authors' code);
      default ``False`` (workers see only their subtask and visible steps).
    - ``max_steps``: the step cap stated in the prompt (the parser enforces its own limit).
    - ``worker_descriptions``: default pool descriptions, used when a call passes ``None``.
    - ``worker_info``: what the prompt says about each worker: ``ordinal`` (its number only,
      the paper's setting and the default) or ``description`` (its description text).
    - ``positional_access``: mention position lists (``[0, 2]``) besides ``"all"``/``[]``.
    - ``max_answer_chars``: previous answers shown in a recursion round are cropped to this.
    - ``assistant_prefill``: text that opens the Conductor's reply (the paper prefills the
      start of its reasoning); the policy continues it, and the parser reads prefill plus
      continuation. Empty: no prefill.
    """

    few_shot: list[Any] = field(default_factory=lambda: list(DEFAULT_FEW_SHOT))
    question_to_workers: bool = False
    max_steps: int = 5
    worker_descriptions: list[str] | None = None
    positional_access: bool = True
    max_answer_chars: int = 2000
    assistant_prefill: str = ""
    worker_info: str = "ordinal"

    def __post_init__(self) -> None:
        self.few_shot = [FewShotExample.coerce(x) for x in self.few_shot]
        if self.max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        if self.worker_info not in WORKER_INFO:
            raise ValueError(f"worker_info must be one of {WORKER_INFO}, got {self.worker_info!r}")
        # Fail early on an unparsable example text rather than at the first prompt.
        for k, ex in enumerate(self.few_shot, start=1):
            wf = ex.resolved(self.max_steps)
            if not self.positional_access:
                # the example would be rendered with a position list that the parser then
                # refuses: the prompt would teach a format the Conductor may not use
                partial = next(
                    (i for i, s in enumerate(wf.steps) if s.access and s.access != tuple(range(i))),
                    None,
                )
                if partial is not None:
                    raise ValueError(
                        f"few-shot example {k}: step {partial} sees only steps "
                        f"{list(wf.steps[partial].access)}, a positional access list, but "
                        "positional_access is false (each step must see all earlier steps or none)"
                    )


_SYSTEM = (
    "You are a coordinator for a team of worker models. You plan who handles what and "
    "what each worker gets to see; you never answer questions yourself."
)


def _rules(config: PromptConfig) -> str:
    access = '"all" = the subtasks and responses of every earlier step, [] = nothing' + (
        ", [0, 2] = only those earlier steps" if config.positional_access else ""
    )
    visibility = (
        "Every worker also sees the question."
        if config.question_to_workers
        else "Workers never see the question, so each subtask must contain everything its "
        "worker needs."
    )
    return (
        f"Write a workflow of 1 to {config.max_steps} steps that answers the question below. "
        "Each step gives one worker a subtask; the response of the last step is the final "
        "answer.\n"
        "Reply with brief reasoning, then three lists of equal length (entry i is step i):\n"
        "model_id: the worker number of each step\n"
        "subtasks: the instruction you write for each worker\n"
        f"access_list: what each worker sees besides its subtask: {access}\n"
        f"{visibility}"
    )


def shown_worker_descriptions(descriptions: Sequence[str], config: PromptConfig) -> list[str]:
    """The description of each worker as the Conductor's prompt shows it ("" = none)."""
    if config.worker_info == "ordinal":
        return ["" for _ in descriptions]
    return [" ".join(str(d).split()) for d in descriptions]


def _workers_block(descriptions: Sequence[str], config: PromptConfig) -> str:
    shown = shown_worker_descriptions(descriptions, config)
    if not any(shown):
        return "Workers: " + ", ".join(str(i) for i in range(len(shown)))
    lines = [f"Worker {i}: {d}" if d else f"Worker {i}" for i, d in enumerate(shown)]
    return "Workers:\n" + "\n".join(lines)


def _example_block(k: int, ex: FewShotExample, n_workers: int, max_steps: int) -> str:
    wf = ex.resolved(max_steps)
    if any(s.worker >= n_workers for s in wf.steps):
        wf = Workflow(
            [Step(s.worker % n_workers, s.subtask, s.access, s.all_access) for s in wf.steps]
        )
    reasoning = ex.reasoning.strip()
    body = f"{reasoning}\n{render_workflow(wf)}" if reasoning else render_workflow(wf)
    return f"Example {k}\nQuestion: {ex.question.strip()}\nReply:\n{body}"


def _descriptions(worker_descriptions: Sequence[str] | None, config: PromptConfig) -> list[str]:
    descriptions = (
        worker_descriptions if worker_descriptions is not None else config.worker_descriptions
    )
    if not descriptions:
        raise ValueError("the worker pool is empty: pass worker_descriptions")
    return list(descriptions)


def conductor_messages(
    question: str,
    worker_descriptions: Sequence[str] | None = None,
    config: PromptConfig | None = None,
) -> list[dict[str, str]]:
    """System + user messages asking the Conductor for a workflow for ``question``.

    The user message holds the format rules, the numbered workers, the few-shot examples
    and, last, the question.
    """
    config = config or PromptConfig()
    return _with_prefill(_planning_request(question, worker_descriptions, config), config)


def _with_prefill(messages: list[dict[str, str]], config: PromptConfig) -> list[dict[str, str]]:
    if not config.assistant_prefill:
        return messages
    return [*messages, {"role": "assistant", "content": config.assistant_prefill}]


def _planning_request(
    question: str, worker_descriptions: Sequence[str] | None, config: PromptConfig
) -> list[dict[str, str]]:
    descriptions = _descriptions(worker_descriptions, config)
    parts = [_rules(config), _workers_block(descriptions, config)]
    parts += [
        _example_block(k, ex, len(descriptions), config.max_steps)
        for k, ex in enumerate(config.few_shot, start=1)
    ]
    parts.append(f"Question: {question.strip()}")
    return [
        {"role": "system", "content": _SYSTEM},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def worker_messages(
    question: str,
    workflow: Workflow,
    step_index: int,
    responses: Mapping[int, str | None],
    config: PromptConfig | None = None,
    previous_round: Sequence[PriorStep] = (),
) -> list[dict[str, str]]:
    """The single user message sent to the worker of step ``step_index``.

    Layout: a framing line; the question in ``<question>`` tags only when
    ``config.question_to_workers``; in a recursion round, when the step was written with
    "all" access (``Step.all_access``), every step of ``previous_round`` in
    ``<previous_subtask>``/``<previous_response>`` blocks (the paper's recursion: "all" also
    shows the earlier round); for each step in the access list a
    ``<subtask step="j" worker="w">`` block and a ``<response step="j" worker="w">`` block
    (a missing or failed response shows as "(no response)"); then "Your subtask:" and the
    subtask. Steps outside the access list are never shown.
    """
    config = config or PromptConfig()
    step = workflow.steps[step_index]
    earlier = list(previous_round) if step.all_access else []
    if step.access or earlier:
        framing = (
            "You are one worker in a team solving a larger task. Work shared by other "
            "workers is shown below: use it to check or build on, then do your own subtask."
        )
    else:
        framing = "You are one worker in a team solving a larger task. Do your subtask."
    parts = [framing]
    if config.question_to_workers:
        parts.append(f"<question>\n{question.strip()}\n</question>")
    if earlier:
        parts.append("An earlier attempt at this task, by another round of workers:")
        for j, prior in enumerate(earlier):
            parts.append(
                f'<previous_subtask step="{j}" worker="{prior.worker}">\n{prior.subtask.strip()}\n'
                f"</previous_subtask>\n"
                f'<previous_response step="{j}" worker="{prior.worker}">\n'
                f"{_shown(prior.response)}\n</previous_response>"
            )
        if step.access:
            parts.append("This round's work so far:")
    steps = workflow.steps
    for j in step.access:
        w = steps[j].worker
        parts.append(
            f'<subtask step="{j}" worker="{w}">\n{steps[j].subtask}\n</subtask>\n'
            f'<response step="{j}" worker="{w}">\n{_shown(responses.get(j))}\n</response>'
        )
    parts.append(f"Your subtask:\n{step.subtask}")
    return [{"role": "user", "content": "\n\n".join(parts)}]


def _shown(response: str | None) -> str:
    if response is None or not response.strip():
        return NO_RESPONSE
    return response.strip()


def _crop(text: str, limit: int) -> str:
    text = text.strip()
    if limit > 0 and len(text) > limit:
        return text[:limit].rstrip() + " [...]"
    return text


def recursion_messages(
    question: str,
    worker_descriptions: Sequence[str] | None,
    previous_text: str,
    previous_answer: str,
    config: PromptConfig | None = None,
) -> list[dict[str, str]]:
    """The Conductor conversation for a recursion round.

    Round-0 messages, then the previous completion as an assistant turn, then a user turn
    showing the final answer it produced and asking for either a new workflow or three
    empty lists to keep that answer (parse the reply with ``allow_empty=True``).
    """
    config = config or PromptConfig()
    answer = _crop(previous_answer or "", config.max_answer_chars) or NO_RESPONSE
    follow_up = (
        "Your workflow was run. Its final answer was:\n"
        f"<answer>\n{answer}\n</answer>\n\n"
        "If the answer looks wrong or incomplete, write a new workflow in the same format; "
        'a step with "all" access then also sees every step of the workflow that was run. '
        "If it should stand, reply with three empty lists:\n"
        "model_id = []\nsubtasks = []\naccess_list = []"
    )
    messages = [
        *_planning_request(question, worker_descriptions, config),
        {"role": "assistant", "content": previous_text},
        {"role": "user", "content": follow_up},
    ]
    return _with_prefill(messages, config)
