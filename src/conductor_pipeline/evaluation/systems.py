"""The systems compared: the Conductor and the baselines, each answering one question at a time.

All of them reach the workers through one :class:`PoolView` (the same pool, the same
response cache), and all return a :class:`QuestionResult`. The baselines follow the
paper's (§5):

- ``solo:<worker>``: the question sent to one worker as it is.
- ``moa``: Mixture-of-Agents. Proposers answer the question as it is (so layer 1 shares the
  cache with the solo runs); each further layer sees the previous layer's answers; one
  aggregator, drawn per question (seeded) or fixed, sees the question and all final-layer
  proposals and writes the answer. The paper's setting is 1 proposer layer + 1 aggregator.
- ``best-of-n:<worker>``: ``n`` samples of one worker (sample 0 is its solo answer) and a
  majority vote over the extracted final answers (self-consistency).

The baselines that run a workflow of their own (``random-workflow``, ``handcrafted``) are in
:mod:`conductor_pipeline.evaluation.fixed_workflows`. ``router`` and ``oracle`` make no
calls; their kinds in :mod:`conductor_pipeline.evaluation.kinds` derive them from the solo
results, and say when and with which settings each system runs.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conductor_pipeline.evaluation.records import QuestionResult
from conductor_pipeline.hashing import content_hash
from conductor_pipeline.tasks import Task, verify
from conductor_pipeline.tasks.answer_extraction import extract_final_answer
from conductor_pipeline.workers.pricing import pool_token_prices
from conductor_pipeline.workers.types import WorkerReply
from conductor_pipeline.workflow import OrchestrationConfig, orchestrate


def fingerprint(*parts: Any) -> str:
    """A result variant: the content hash of ``parts`` (dataclasses included), in the
    encoding stored results are keyed by."""
    return content_hash(list(parts), spaced=True)


# ---------------------------------------------------------------------------------------
# The pool as the systems see it
# ---------------------------------------------------------------------------------------


@dataclass
class PoolView:
    """A worker caller plus what evaluation needs to know about its workers.

    ``prices[i]``: (input, output) dollars per token of worker ``i``, used to charge a reply
    served from the response cache at list price (the pool charges cache hits $0, which
    would make every system's cost depend on what ran before it); ``None``: no price known,
    such a hit is charged what the pool reports. ``simulated[i]``: the worker is a sandbox
    simulation (reports label it).
    """

    caller: Callable[..., Any]
    names: list[str]
    descriptions: list[str]
    prices: list[tuple[float, float] | None] = field(default_factory=list)
    simulated: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.names)
        if len(self.descriptions) != n:
            raise ValueError("PoolView: one description per worker")
        self.prices = list(self.prices) or [None] * n
        self.simulated = list(self.simulated) or [name.startswith("sim-") for name in self.names]

    @classmethod
    def from_pool(cls, pool: Any) -> PoolView:
        """A view of a ``WorkerPool`` (or the fault-injecting wrapper of one), priced as
        training prices it (:func:`~conductor_pipeline.workers.pricing.token_prices`)."""
        prices = pool_token_prices(pool)
        return cls(pool, list(pool.names), list(pool.descriptions), prices)

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise ValueError(f"no worker named {name!r} in the pool {self.names}") from None

    def list_cost(self, worker: int, prompt_tokens: int, completion_tokens: int) -> float | None:
        price = self.prices[worker] if 0 <= worker < len(self.prices) else None
        if price is None:
            return None
        return prompt_tokens * price[0] + completion_tokens * price[1]

    async def call(
        self, worker: int, messages: list[dict[str, str]], sample_index: int = 0, **overrides: Any
    ) -> WorkerReply:
        # overrides: the executor's call options (max_tokens capped by a request budget)
        reply = await self.caller(worker, messages, sample_index, **overrides)
        usage = getattr(reply, "usage", None)
        if usage is not None and usage.cache_hit and not usage.cost_usd:
            cost = self.list_cost(worker, usage.prompt_tokens, usage.completion_tokens)
            if cost is not None:
                usage.cost_usd = cost
        return reply

    __call__ = call


# ---------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------


async def judge(task: Task, answer: str):
    """``verify`` off the event loop (the code verifier runs a sandboxed subprocess)."""
    return await asyncio.to_thread(verify, task, answer or "")


def _reply_record(pool: PoolView, worker: int, reply: WorkerReply, **extra: Any) -> dict[str, Any]:
    usage = reply.usage
    return {
        "worker": worker,
        "worker_name": pool.names[worker],
        "response": reply.text,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cost_usd": usage.cost_usd,
        "latency_s": usage.latency_s,
        "cache_hit": usage.cache_hit,
        "failure": reply.failure.value if reply.failure else None,
        "error": reply.error,
        **extra,
    }


def _from_calls(
    result: QuestionResult, calls: Sequence[dict[str, Any]], latency_s: float
) -> QuestionResult:
    result.cost_usd = float(sum(c["cost_usd"] for c in calls))
    result.tokens = int(sum(c["prompt_tokens"] + c["completion_tokens"] for c in calls))
    result.calls = len(calls)
    result.failed_calls = sum(1 for c in calls if c["failure"])
    result.infra_failure = result.failed_calls > 0
    result.cache_hits = sum(1 for c in calls if c["cache_hit"])
    result.workers = [c["worker_name"] for c in calls]
    result.latency_s = latency_s
    return result


async def finish_result(result: QuestionResult, task: Task, answer: str) -> QuestionResult:
    """``result`` with ``answer`` and the verifier's verdict on it."""
    verdict = await judge(task, answer)
    result.answer = answer
    result.correct = bool(verdict.correct)
    result.score = float(verdict.score)
    result.extracted = verdict.extracted
    result.verdict = verdict.reason
    return result


class System:
    """A named way of answering a question. ``variant`` fingerprints its settings."""

    name: str
    variant: str

    def blank(self, task: Task, split: str) -> QuestionResult:
        return QuestionResult(
            system=self.name,
            variant=self.variant,
            question_id=task.id,
            split=split,
            domain=task.domain,
            difficulty=task.difficulty,
            source=task.source,
            question_hash=QuestionResult.hash_task(task.question, task.answer),
        )

    async def answer(self, task: Task, split: str) -> QuestionResult:
        raise NotImplementedError

    async def run(self, task: Task, split: str) -> QuestionResult:
        """``answer``, with an unexpected error recorded as an infrastructure failure of
        this question (kept, left out of accuracy, run again on resume) instead of stopping
        the evaluation."""
        start = time.perf_counter()
        try:
            return await self.answer(task, split)
        except Exception as exc:
            result = self.blank(task, split)
            result.error = f"{type(exc).__name__}: {exc}"[:1000]
            result.infra_failure = True
            result.verdict = "system error"
            result.latency_s = time.perf_counter() - start
            return result


# ---------------------------------------------------------------------------------------
# The Conductor (and the base policy, which is the same code with another model)
# ---------------------------------------------------------------------------------------


class ConductorSystem(System):
    def __init__(
        self,
        name: str,
        policy: Any,
        pool: PoolView,
        config: OrchestrationConfig,
        *,
        variant: str,
        label: str,
    ):
        self.name, self.policy, self.pool, self.config = name, policy, pool, config
        self.variant, self.label = variant, label

    async def answer(self, task: Task, split: str) -> QuestionResult:
        result = self.blank(task, split)
        result.policy = self.label
        outcome = await orchestrate(
            task.question,
            self.policy,
            self.pool.call,
            self.pool.descriptions,
            worker_names=self.pool.names,
            config=self.config,
        )
        record = outcome.to_dict()
        record["worker_names"] = list(self.pool.names)
        executed = [
            step
            for round_ in outcome.rounds
            if round_.execution is not None
            for step in round_.execution.steps
            if step.started_at is not None
        ]
        final = outcome.final_round
        result.cost_usd = outcome.worker_cost_usd
        result.tokens = outcome.worker_tokens
        result.conductor_tokens = outcome.conductor_tokens
        result.calls = outcome.worker_calls
        result.latency_s = outcome.latency_s
        result.failed_calls = outcome.infra_failures
        result.infra_failure = result.failed_calls > 0
        result.parse_failure = outcome.format_failure
        result.failed_samples = sum(1 for c in outcome.conductor_calls if c.parse_error)
        result.cache_hits = sum(1 for s in executed if s.cache_hit)
        result.workers = [s.worker_name or self.pool.names[s.worker] for s in executed]
        if final is not None and final.workflow is not None:
            result.n_steps = len(final.workflow)
            result.access_pattern = final.workflow.access_pattern()
        result.detail = record
        return await finish_result(result, task, outcome.answer)


# ---------------------------------------------------------------------------------------
# Baselines
# ---------------------------------------------------------------------------------------


def _as_is(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


class SoloSystem(System):
    def __init__(self, pool: PoolView, worker: int, *, pool_id: str):
        self.pool, self.worker = pool, worker
        self.name = f"solo:{pool.names[worker]}"
        self.variant = fingerprint("solo", pool_id, pool.names[worker])

    async def answer(self, task: Task, split: str) -> QuestionResult:
        start = time.perf_counter()
        reply = await self.pool.call(self.worker, _as_is(task.question), 0)
        result = _from_calls(
            self.blank(task, split),
            [_reply_record(self.pool, self.worker, reply)],
            time.perf_counter() - start,
        )
        result.detail = {"calls": [_reply_record(self.pool, self.worker, reply)]}
        return await finish_result(result, task, reply.text or "")


_AGGREGATE = (
    "Below are answers that several assistants gave to the question that follows them. Some "
    "may be wrong. Weigh them critically and write one answer of your own that is as "
    "accurate as possible, ending with the final answer in the format the question asks for."
)


def aggregate_prompt(question: str, responses: Sequence[str | None]) -> list[dict[str, str]]:
    """The MoA aggregate-and-synthesize message: numbered proposals, then the question."""
    blocks = [
        f"[{k}] {(text or '').strip() or '(no answer)'}" for k, text in enumerate(responses, 1)
    ]
    body = "\n\n".join([_AGGREGATE, "Answers:", *blocks, f"Question:\n{question.strip()}"])
    return [{"role": "user", "content": body}]


class MoASystem(System):
    name = "moa"

    def __init__(
        self,
        pool: PoolView,
        proposers: Sequence[int],
        *,
        layers: int = 1,
        aggregator: str = "random",
        seed: int = 0,
        pool_id: str = "",
    ):
        if not proposers:
            raise ValueError("moa: at least one proposer")
        self.pool, self.proposers, self.layers, self.seed = pool, list(proposers), layers, seed
        self.aggregator = None if aggregator == "random" else pool.index(aggregator)
        self.variant = fingerprint(
            "moa", pool_id, [pool.names[p] for p in self.proposers], layers, aggregator, seed
        )

    def pick_aggregator(self, task: Task) -> int:
        if self.aggregator is not None:
            return self.aggregator
        return random.Random(f"moa:{self.seed}:{task.id}").choice(self.proposers)

    async def answer(self, task: Task, split: str) -> QuestionResult:
        start = time.perf_counter()
        calls: list[dict[str, Any]] = []
        responses: list[str | None] = []
        for layer in range(1, self.layers + 1):
            messages = (
                _as_is(task.question) if layer == 1 else aggregate_prompt(task.question, responses)
            )
            replies = await asyncio.gather(
                *(self.pool.call(p, messages, 0) for p in self.proposers)
            )
            calls += [
                _reply_record(self.pool, p, r, role=f"proposer layer {layer}")
                for p, r in zip(self.proposers, replies, strict=True)
            ]
            responses = [r.text if r.ok else None for r in replies]
        aggregator = self.pick_aggregator(task)
        final = await self.pool.call(aggregator, aggregate_prompt(task.question, responses), 0)
        calls.append(_reply_record(self.pool, aggregator, final, role="aggregator"))
        answer = final.text if final.ok and (final.text or "").strip() else ""
        note = None
        if not answer:  # as the executor does: fall back to the last non-empty response
            answer = next((r for r in reversed(responses) if r and r.strip()), "")
            note = "aggregator failed; last proposal used"
        result = _from_calls(self.blank(task, split), calls, time.perf_counter() - start)
        result.n_steps = len(calls)
        result.note = note
        result.detail = {"aggregator": self.pool.names[aggregator], "calls": calls}
        return await finish_result(result, task, answer)


def _vote_key(extracted: str | None, answer_format: str) -> str | None:
    if extracted is None:
        return None
    text = " ".join(extracted.split())
    if answer_format in ("number", "math"):
        try:
            return repr(float(text.replace(",", "")))
        except ValueError:
            return text.replace(" ", "")
    return text if answer_format == "code" else text.lower()


def majority_vote(
    texts: Sequence[str | None], answer_format: str
) -> tuple[int | None, dict[str, int]]:
    """The index of the sample whose extracted final answer is the most common (ties: the
    earliest); samples without a readable answer do not vote. ``None`` if none has text."""
    keys = [
        _vote_key(extract_final_answer(t, answer_format), answer_format) if t else None
        for t in texts
    ]
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return next((i for i, t in enumerate(texts) if t and t.strip()), None), {}
    best = max(counts.values())
    winner = next(k for k in keys if k is not None and counts[k] == best)
    return keys.index(winner), dict(counts)


class BestOfNSystem(System):
    """``name``: another kind reusing the vote under its own name (default
    ``best-of-n:<worker>``)."""

    def __init__(
        self,
        pool: PoolView,
        worker: int,
        n: int,
        *,
        pool_id: str = "",
        note: str = "",
        name: str | None = None,
    ):
        if n < 1:
            raise ValueError("best-of-n: n must be at least 1")
        self.pool, self.worker, self.n, self.note = pool, worker, n, note
        self.name = name or f"best-of-n:{pool.names[worker]}"
        self.variant = fingerprint("best-of-n", pool_id, pool.names[worker], n)

    async def answer(self, task: Task, split: str) -> QuestionResult:
        start = time.perf_counter()
        messages = _as_is(task.question)
        replies = await asyncio.gather(
            *(self.pool.call(self.worker, messages, i) for i in range(self.n))
        )
        calls = [_reply_record(self.pool, self.worker, r, sample=i) for i, r in enumerate(replies)]
        texts = [r.text if r.ok else None for r in replies]
        chosen, votes = majority_vote(texts, task.answer_format)
        result = _from_calls(self.blank(task, split), calls, time.perf_counter() - start)
        result.n_steps = self.n
        result.note = self.note or None
        result.detail = {"n": self.n, "chosen_sample": chosen, "votes": votes, "calls": calls}
        return await finish_result(result, task, texts[chosen] if chosen is not None else "")
