"""Simulated workers: profile-driven stand-ins for LLMs over the prepared task set.

A simulated worker runs no model. It looks for prepared tasks in the text it was sent
(:class:`TaskIndex`), and answers according to its profile:

* the task's question is **visible** (at least 60 % of the question's word 6-grams occur in
  the messages): it solves it with probability ``skill[domain][difficulty]``; failing that,
  if a correct earlier attempt is visible, it adopts it with probability ``verify_skill``;
  otherwise it answers wrong (copying a visible wrong attempt when it fails to spot the
  error);
* the task is only **recognisable** (some of its 6-grams occur, too few to count as
  visible): it has not understood the question and is right only at ``guess_rate``
  (multiple choice: it picks a random letter);
* **no task** is recognisable: it answers like a model that misunderstood, with a
  plausible but unfounded answer in a format guessed from the text.

**A worker's luck on a task is fixed.** Whether it solves a task, spots a correct earlier
attempt, guesses right, and which wrong answer it gives are drawn once per (server seed,
worker, task): asking the same worker again, at another seed or temperature, or having it
check its own answer gives it no new chance, as self-reflection gives real models none (the
paper's Table 7: five rounds leave Gemini 2.5 Pro at 64.14 -> 64.20, Claude Sonnet 4 at
61.04 -> 60.33, GPT-5 at 63.72 -> 64.52). A different worker has luck of its own, so its
check can pay. A profile's ``call_variation`` is the share of calls that draw fresh luck
instead (0 for every sandbox worker).

Replies are a few sentences of generic reasoning followed by the final answer in the
task's format; wrong answers are made to be verifiably wrong. The reasoning text and the
latency come from a ``random.Random`` seeded by a hash of (server seed, request seed,
worker, messages, temperature), so a request always gets the same reply.

This module holds the worker and its reply text; finding tasks in the text is
:mod:`.task_index`, reading, checking and corrupting answers is :mod:`.answers`.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from conductor_pipeline.tasks.types import Task
from conductor_pipeline.workers.sandbox.answers import (
    LETTERS,
    break_code,
    extract_attempts,
    is_correct,
    letter_count,
    option_letter,
    render_answer,
    wrong_answer,
)
from conductor_pipeline.workers.sandbox.profiles import SimulatedProfile
from conductor_pipeline.workers.sandbox.task_index import (
    NGRAM,
    RECOGNISED_SHARE,
    TOKENS_PER_WORD,
    VISIBLE_SHARE,
    TaskIndex,
    TaskMatch,
    count_tokens,
    message_text,
    prompt_token_count,
)

# the worker is defined here; the task index and the answer helpers it uses live in
# .task_index and .answers and stay importable from here, where callers found them first
__all__ = [
    "NGRAM",
    "RECOGNISED_SHARE",
    "RIGHT_MODES",
    "VISIBLE_SHARE",
    "SimulatedReply",
    "SimulatedWorker",
    "TaskIndex",
    "TaskLuck",
    "TaskMatch",
    "break_code",
    "count_tokens",
    "extract_attempts",
    "is_correct",
    "letter_count",
    "message_text",
    "prompt_token_count",
    "render_answer",
    "visible_reply_mode",
    "wrong_answer",
]


# --- reasoning filler ---------------------------------------------------------------------

_OPENERS = {
    "solve": (
        "Let me work through this carefully.",
        "I will tackle the subtask directly.",
        "Here is how I approach it.",
    ),
    "confirm": (
        "An earlier step already proposed an answer, so I re-derived it independently.",
        "I checked the previous attempt against my own working and they agree.",
    ),
    "fix": (
        "The earlier attempt contains a slip, so I redid that part myself.",
        "I do not agree with the previous answer; recomputing gives something else.",
    ),
    "adopt": (
        "The earlier attempt looks sound; I retraced its key steps and they hold up.",
        "Checking the proposed answer against the question, it is consistent.",
    ),
    "copy": (
        "The previous attempt seems reasonable, so I build on it.",
        "I follow the line of reasoning already given above.",
    ),
    "wrong": (
        "Let me work through this carefully.",
        "Here is how I approach it.",
        "I will tackle the subtask directly.",
    ),
    "garbled": (
        "Some details of the problem seem to be missing, so I fill the gaps as best I can.",
        "The statement is a little unclear to me; I go with the most likely reading.",
    ),
    "confused": (
        "I am not sure what exactly is being asked, so I make a reasonable assumption.",
        "The request is not entirely clear; here is my best interpretation.",
    ),
}
_GENERIC = (
    "First I pin down what the question actually asks for.",
    "Splitting the problem into smaller parts makes each one easy to check.",
    "The relevant quantities are given in the statement.",
    "Writing the relationships out shows which values depend on which.",
    "There is a tempting shortcut, but being explicit is safer.",
    "Each intermediate result has to respect the stated conditions.",
    "A quick check of the size of the result helps to catch slips.",
    "An alternative route leads to the same place, which is reassuring.",
    "Edge cases deserve a moment before committing to an answer.",
    "Nothing suggests a trick, so the direct route should work.",
    "Keeping signs and units straight avoids the usual mistakes.",
    "Now the partial results can be put together.",
    "I go over the steps once more to make sure none was skipped.",
    "The constraints narrow the possibilities down quickly.",
    "Only one candidate survives all of the checks.",
)
_DOMAIN = {
    "math": (
        "Simplifying before substituting numbers keeps the arithmetic small.",
        "The calculation is short once the expression is set up.",
    ),
    "logic": (
        "Listing the cases and ruling out the impossible ones narrows it down.",
        "Each statement restricts which arrangements remain consistent.",
    ),
    "algorithmic": (
        "Tracing the procedure by hand on the given input settles it.",
        "Following the rule step by step gives the sequence of states.",
    ),
    "code": (
        "The function must also behave sensibly on empty input.",
        "A single pass over the input is enough here.",
    ),
}


def _reasoning(rng: random.Random, mode: str, domain: str, mean_words: float) -> str:
    target = max(4, round(mean_words * rng.uniform(0.6, 1.4)))
    sentences = [rng.choice(_OPENERS[mode])]
    pool = list(_GENERIC) + list(_DOMAIN.get(domain, ())) * 2
    distinct = len(set(pool))
    words = len(sentences[0].split())
    while words < target:
        sentence = rng.choice(pool)
        if sentence in sentences and len(set(sentences) & set(pool)) < distinct:
            continue  # no repeats until every sentence has been used once
        sentences.append(sentence)
        words += len(sentence.split())
    return " ".join(sentences)


# --- the worker ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SimulatedReply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    finish_reason: str
    # what happened, for tests and debugging (not sent to clients)
    mode: str  # solve | confirm | fix | adopt | copy | wrong | garbled | confused
    task_id: str | None
    correct: bool | None  # None when no task was recognised


# the reply modes whose answer is right
RIGHT_MODES = frozenset({"solve", "confirm", "fix", "adopt"})


def visible_reply_mode(*, solved: bool, checked: bool, right_seen: bool, wrong_seen: bool) -> str:
    """How a worker answers a task it can see, given its luck (``solved``: it solves the
    task; ``checked``: it spots whether an earlier attempt is right) and the earlier
    attempts in its context. The one statement of the rule: the workers and the strategy
    calculator (:mod:`conductor_pipeline.evaluation.strategies`) both use it.

    ``solve`` / ``confirm`` / ``fix``: right on its own (no attempt seen / a right one seen /
    only wrong ones seen); ``adopt``: right by taking a correct attempt; ``copy``: wrong by
    taking a wrong attempt it failed to check; ``wrong``: a wrong answer of its own.
    """
    if solved:
        return "confirm" if right_seen else ("fix" if wrong_seen else "solve")
    if right_seen and checked:
        return "adopt"
    if wrong_seen and not checked:
        return "copy"
    return "wrong"


@dataclass(frozen=True)
class TaskLuck:
    """A worker's draws on one task: uniforms compared with ``skill``, ``verify_skill`` and
    ``guess_rate``, and the seed of the wrong answer (or guessed letter) it gives."""

    solve: float
    check: float
    guess: float
    answer_seed: int

    @classmethod
    def draw(cls, rng: random.Random) -> TaskLuck:
        return cls(rng.random(), rng.random(), rng.random(), rng.getrandbits(64))


class SimulatedWorker:
    """One simulated worker: a profile plus the index of the tasks it can recognise."""

    def __init__(
        self, profile: SimulatedProfile, task_index: TaskIndex, *, base_seed: int = 0
    ) -> None:
        self.profile = profile
        self.index = task_index
        self.base_seed = int(base_seed)

    @property
    def name(self) -> str:
        return self.profile.name

    def _rng(
        self, messages: Sequence[dict[str, Any]], seed: int, temperature: float
    ) -> random.Random:
        payload = json.dumps(
            [
                self.base_seed,
                int(seed),
                self.profile.name,
                [[m.get("role", ""), message_text(m)] for m in messages],
                round(float(temperature), 6),
            ],
            ensure_ascii=False,
        )
        digest = hashlib.sha256(payload.encode("utf-8")).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))

    def luck(self, task: Task, call_rng: random.Random | None = None) -> TaskLuck:
        """The worker's luck on ``task``: fixed for (server seed, worker, task); with the
        profile's ``call_variation``, that share of calls draws it from ``call_rng``."""
        variation = self.profile.call_variation
        if call_rng is not None and variation > 0 and call_rng.random() < variation:
            return TaskLuck.draw(call_rng)
        payload = json.dumps([self.base_seed, self.profile.name, task.id], ensure_ascii=False)
        digest = hashlib.sha256(payload.encode("utf-8")).digest()
        return TaskLuck.draw(random.Random(int.from_bytes(digest[:8], "big")))

    def respond(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        seed: int = 0,
        temperature: float = 1.0,
        max_tokens: int | None = None,
    ) -> SimulatedReply:
        rng = self._rng(messages, seed, temperature)
        text = "\n\n".join(message_text(m) for m in messages)
        matches = self.index.scan(text)
        best = matches[0] if matches else None

        task: Task | None = best.task if best else None
        correct: bool | None = None
        if best is not None and best.visible:
            final, mode, correct = self._answer_visible(best.task, text, self.luck(best.task, rng))
        elif best is not None:
            final, mode, correct = self._answer_garbled(best.task, self.luck(best.task, rng))
        else:
            final, mode = self._answer_confused(text, rng), "confused"

        domain = task.domain if task else ""
        body = _reasoning(rng, mode, domain, self.profile.mean_words)
        reply = f"{body}\n\n{final}"
        completion_tokens = count_tokens(reply)
        finish_reason = "stop"
        if max_tokens is not None and completion_tokens > max_tokens:
            reply = _truncate_words(reply, int(max_tokens / TOKENS_PER_WORD))
            completion_tokens = min(count_tokens(reply), max_tokens)
            finish_reason = "length"
            if task is not None and correct and not _still_has_answer(task, reply):
                correct = False
        latency = self.profile.latency
        wait = latency.median_s
        if latency.sigma > 0 and latency.median_s > 0:
            wait = rng.lognormvariate(math.log(latency.median_s), latency.sigma)
        wait += latency.per_output_token_s * completion_tokens
        return SimulatedReply(
            text=reply,
            prompt_tokens=prompt_token_count(messages),
            completion_tokens=completion_tokens,
            latency_s=wait,
            finish_reason=finish_reason,
            mode=mode,
            task_id=task.id if task else None,
            correct=correct,
        )

    def reply(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        seed: int = 0,
        temperature: float = 1.0,
        max_tokens: int | None = None,
    ) -> tuple[str, int, int, float]:
        """``(text, prompt_tokens, completion_tokens, simulated_latency_s)``."""
        r = self.respond(messages, seed=seed, temperature=temperature, max_tokens=max_tokens)
        return r.text, r.prompt_tokens, r.completion_tokens, r.latency_s

    # -- decisions --

    def _answer_visible(self, task: Task, text: str, luck: TaskLuck) -> tuple[str, str, bool]:
        # Earlier attempts: answers put forward in the text, outside the question itself.
        attempts = extract_attempts(text.replace(task.question, " "), task.answer_format)
        verdicts = [(a, is_correct(task, a)) for a in attempts]
        right = [a for a, ok in verdicts if ok]
        wrong = [a for a, ok in verdicts if not ok]
        mode = visible_reply_mode(
            solved=luck.solve < self.profile.skill_for(task.domain, task.difficulty),
            checked=luck.check < self.profile.verify_skill,
            right_seen=bool(right),
            wrong_seen=bool(wrong),
        )
        fmt = task.answer_format
        if mode in RIGHT_MODES:
            return render_answer(fmt, task.answer), mode, True
        if mode == "copy":
            return render_answer(fmt, Counter(wrong).most_common(1)[0][0]), mode, False
        own = wrong_answer(task, random.Random(luck.answer_seed))
        return render_answer(fmt, own), mode, False

    def _answer_garbled(self, task: Task, luck: TaskLuck) -> tuple[str, str, bool]:
        fmt = task.answer_format
        rng = random.Random(luck.answer_seed)
        if fmt == "letter":
            pick = rng.choice(LETTERS[: letter_count(task)])
            return render_answer(fmt, pick), "garbled", pick == option_letter(task.answer)
        if luck.guess < self.profile.guess_rate:
            return render_answer(fmt, task.answer), "garbled", True
        return render_answer(fmt, wrong_answer(task, rng)), "garbled", False

    def _answer_confused(self, text: str, rng: random.Random) -> str:
        if "```" in text or re.search(r"\bdef \w+\(", text):
            name = (re.findall(r"\bdef (\w+)\(", text) or ["solution"])[-1]
            return render_answer("code", f"def {name}(*args):\n    return None")
        if re.search(r"\(([A-D])\)", text):
            return render_answer("letter", rng.choice("ABCD"))
        if "<answer>" in text.lower():
            return render_answer("text", str(rng.randint(0, 99)))
        return render_answer("number", str(rng.randint(0, 120)))


def _truncate_words(text: str, words: int) -> str:
    if words <= 0:
        return ""
    for i, match in enumerate(re.finditer(r"\S+", text)):
        if i == words - 1:
            return text[: match.end()]
    return text


def _still_has_answer(task: Task, text: str) -> bool:
    return any(is_correct(task, a) for a in extract_attempts(text, task.answer_format))
