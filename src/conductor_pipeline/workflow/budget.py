"""Per-request budgets and how they bind inside a step.

A :class:`Budget` limits the worker steps, tokens and dollars of one question. The executor
keeps a :class:`BudgetLedger` per run: before a step calls its worker, the ledger decides
(:meth:`BudgetLedger.plan`) whether the call may start and with which completion cap
(``max_tokens``), counting what finished calls spent and what calls in flight may still
spend (each holds a reservation: its prompt estimate plus its completion cap, released to
its real usage when it finishes).

Prompt tokens are estimated before the call (:func:`estimate_prompt_tokens`: a character
count divided by three, plus a few tokens per message, which overcounts English text for
common tokenizers). A provider that counts more than the estimate can still take a run a
little over a token or dollar limit; the reply is recorded as it came.

Dollars bind inside a step only for workers whose prices are known (:class:`WorkerLimits`);
for the others ``max_cost_usd`` is checked between calls, against what finished calls cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from conductor_pipeline.config_checks import is_int
from conductor_pipeline.workers.pricing import TokenPrices, token_prices

__all__ = [
    "Budget",
    "BudgetLedger",
    "CallPlan",
    "WorkerLimits",
    "caller_limits",
    "estimate_prompt_tokens",
]

# tokens a chat template adds around each message (role markers, separators)
_TOKENS_PER_MESSAGE = 4
# how far :func:`caller_limits` follows wrappers (a retrying caller around a fault injector
# around a pool) looking for the pool's specs
_MAX_WRAPPERS = 5


@dataclass(frozen=True)
class Budget:
    """Hard per-request limits; ``None`` means unlimited."""

    max_steps: int | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None

    def refusal(self, calls_started: int, tokens: int, cost_usd: float) -> str | None:
        """The name of the first limit already reached, or ``None`` if a call may start."""
        if self.max_steps is not None and calls_started >= self.max_steps:
            return "max_steps"
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return "max_tokens"
        if self.max_cost_usd is not None and cost_usd >= self.max_cost_usd:
            return "max_cost_usd"
        return None


@dataclass(frozen=True)
class WorkerLimits:
    """What the executor knows of one worker: its own completion cap (its configured
    ``max_tokens``; ``None`` when not configured) and its list prices (dollars per prompt
    and per completion token; ``None`` when unknown)."""

    max_tokens: int | None = None
    prices: TokenPrices | None = None


@dataclass(frozen=True)
class CallPlan:
    """The ledger's decision for one step.

    ``refusal``: the budget that stops the step (it is skipped). ``wait``: the step must
    wait for a call in flight to finish (what it reserved may come back). Otherwise the call
    starts; ``max_tokens`` is the completion cap to send (``None``: the worker's own),
    ``capped_by`` the budget that set it, and ``tokens``/``cost_usd`` what the call reserves
    until it finishes.
    """

    refusal: str | None = None
    wait: bool = False
    max_tokens: int | None = None
    capped_by: str | None = None
    tokens: int = 0
    cost_usd: float = 0.0


def estimate_prompt_tokens(messages: Sequence[dict[str, Any]]) -> int:
    """A conservative prompt token count: characters / 3, plus a few tokens per message."""
    chars = sum(len(str(m.get("content") or "")) for m in messages)
    return math.ceil(chars / 3) + _TOKENS_PER_MESSAGE * len(messages)


class BudgetLedger:
    """What one run has spent and reserved against its budget (one event loop: no locks)."""

    def __init__(self, budget: Budget | None, limits: Sequence[WorkerLimits] | None) -> None:
        self.budget = budget
        self.limits = list(limits or [])
        self.calls_started = 0
        self.tokens_spent = 0
        self.cost_spent = 0.0
        self.tokens_reserved = 0
        self.cost_reserved = 0.0
        self.in_flight = 0
        # the limit a call's completion cap came from when the reply used the whole cap
        self.cap_reached: str | None = None

    def _worker(self, worker: int) -> WorkerLimits:
        if 0 <= worker < len(self.limits):
            return self.limits[worker]
        return WorkerLimits()

    def plan(self, worker: int, messages: Sequence[dict[str, Any]]) -> CallPlan:
        """May a call to ``worker`` with ``messages`` start now, and capped at what?"""
        budget = self.budget
        if budget is None:
            return CallPlan()
        refused = budget.refusal(self.calls_started, self.tokens_spent, self.cost_spent)
        if refused is not None:
            return CallPlan(refusal=refused)
        limits = self._worker(worker)
        prompt = estimate_prompt_tokens(messages)
        caps: list[tuple[int, str]] = []
        if budget.max_tokens is not None:
            left = budget.max_tokens - self.tokens_spent - self.tokens_reserved
            caps.append((left - prompt, "max_tokens"))
        priced = budget.max_cost_usd is not None and limits.prices is not None
        if priced:
            cost_cap = self._cost_cap(budget.max_cost_usd, limits.prices, prompt)
            if cost_cap is not None:
                caps.append((cost_cap, "max_cost_usd"))
        if not caps:  # only max_steps, or dollars at unknown prices: between calls only
            return CallPlan()
        cap, name = min(caps)
        own = limits.max_tokens
        if own is not None and cap >= own:
            # the worker's own cap fits: the call goes out as without a budget
            return self._reserve(prompt, own, limits.prices if priced else None)
        if self.in_flight:
            # what a call in flight reserved may come back: wait rather than cut this one short
            return CallPlan(wait=True)
        if cap < 1:
            return CallPlan(refusal=name)
        plan = self._reserve(prompt, cap, limits.prices if priced else None)
        return replace(plan, max_tokens=cap, capped_by=name)

    def _cost_cap(self, max_cost_usd: float, prices: TokenPrices, prompt: int) -> int | None:
        prompt_price, completion_price = prices
        room = max_cost_usd - self.cost_spent - self.cost_reserved - prompt * prompt_price
        if completion_price <= 0:  # completions are free: dollars cap nothing but the prompt
            return None if room >= 0 else 0
        return math.floor(room / completion_price)

    @staticmethod
    def _reserve(prompt: int, completion: int, prices: TokenPrices | None) -> CallPlan:
        cost = 0.0 if prices is None else prompt * prices[0] + completion * prices[1]
        return CallPlan(tokens=prompt + completion, cost_usd=cost)

    def start(self, plan: CallPlan) -> None:
        self.calls_started += 1
        self.in_flight += 1
        self.tokens_reserved += plan.tokens
        self.cost_reserved += plan.cost_usd

    def finish(self, plan: CallPlan, tokens: int, cost_usd: float, completion_tokens: int) -> None:
        """Release ``plan``'s reservation to what the call really spent."""
        self.in_flight -= 1
        self.tokens_reserved -= plan.tokens
        self.cost_reserved -= plan.cost_usd
        self.tokens_spent += tokens
        self.cost_spent += cost_usd
        if plan.max_tokens is not None and completion_tokens >= plan.max_tokens:
            # the reply filled the cap a budget set: that budget cut it short
            self.cap_reached = self.cap_reached or plan.capped_by

    def exhausted(self) -> str | None:
        """The limit that finished calls used up (or whose cap a reply filled), if any."""
        budget = self.budget
        if budget is None:
            return None
        if budget.max_tokens is not None and self.tokens_spent >= budget.max_tokens:
            return "max_tokens"
        if budget.max_cost_usd is not None and self.cost_spent >= budget.max_cost_usd:
            return "max_cost_usd"
        return self.cap_reached


def caller_limits(caller: Any, *, with_prices: bool = True) -> list[WorkerLimits] | None:
    """Each worker's :class:`WorkerLimits`, read from the pool's ``specs`` behind ``caller``
    (a pool, its bound ``call``, or a wrapper holding it as ``inner`` or ``caller``);
    ``None`` when there is no pool to read them from. ``with_prices=False`` skips the price
    lookup (LiteLLM's map for workers without configured prices)."""
    obj = caller
    for _ in range(_MAX_WRAPPERS):
        if obj is None:
            return None
        specs = getattr(obj, "specs", None)
        if isinstance(specs, (list, tuple)):
            return [
                WorkerLimits(
                    _max_tokens(s),
                    _prices(s) if with_prices else None,
                )
                for s in specs
            ]
        obj = next(
            (
                inner
                for inner in (getattr(obj, name, None) for name in ("__self__", "inner", "caller"))
                if inner is not None
            ),
            None,
        )
    return None


def _max_tokens(spec: Any) -> int | None:
    value = getattr(spec, "max_tokens", None)
    return value if is_int(value, minimum=1) else None  # unset or unusable: no cap per call


def _prices(spec: Any) -> TokenPrices | None:
    try:
        return token_prices(spec)
    except Exception:  # an unpriceable spec leaves dollars binding between calls only
        return None
