"""The training stage's inputs: the worker pool as training sees it (:class:`PoolInfo`) and
the train split turned into GRPO prompts (:func:`build_prompt_dataset`)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from conductor_pipeline.generation.chat import encode_chat
from conductor_pipeline.hashing import content_hash
from conductor_pipeline.tasks import Task
from conductor_pipeline.training.configs import TrainingConfig
from conductor_pipeline.training.rewards import task_columns
from conductor_pipeline.workers.pricing import pool_token_prices
from conductor_pipeline.workers.types import WorkerCaller
from conductor_pipeline.workflow import PromptConfig, conductor_messages

__all__ = ["PoolInfo", "build_prompt_dataset", "data_version", "interleave_domains"]


@dataclass
class PoolInfo:
    """What training needs from a worker pool: the caller, names, descriptions, prices.

    ``prices[i]`` is ``(dollars per prompt token, dollars per completion token)`` or
    ``None`` when unknown. A ``WorkerPool`` converts with :meth:`from_pool`, which prices
    workers as evaluation does (:func:`~conductor_pipeline.workers.pricing.token_prices`).
    """

    call: WorkerCaller
    names: list[str]
    descriptions: list[str]
    prices: list[tuple[float, float] | None] = field(default_factory=list)

    @classmethod
    def from_pool(cls, pool: Any) -> PoolInfo:
        return cls(pool, list(pool.names), list(pool.descriptions), pool_token_prices(pool))

    def fingerprint(self) -> str:
        """Hash of worker names and prices (never endpoints or keys)."""
        prices = [list(p) if p else None for p in self.prices]
        return content_hash({"names": self.names, "prices": prices})


def data_version(tasks: Sequence[Task]) -> str:
    """Hash of the train split's content (ids, questions, answers, verifiers)."""
    rows = sorted((t.id, t.question, t.answer, t.verifier) for t in tasks)
    return content_hash(rows)


def interleave_domains(rows: Sequence[dict[str, Any]], *, seed: int) -> list[dict[str, Any]]:
    """``rows`` in a seeded order that takes the domains in turn (each domain's rows
    shuffled), so that consecutive rows cover the domains evenly. GRPO reads the rows in this
    order with ``shuffle_dataset`` off (``grpo.balanced_domains``): every step of
    ``prompts_per_step`` questions then spans the domains, instead of a step of four maths
    questions saying nothing about where logic questions should go."""
    rng = random.Random(seed)
    by_domain: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_domain.setdefault(str(row.get("domain")), []).append(row)
    queues = [by_domain[d] for d in sorted(by_domain)]
    for queue in queues:
        rng.shuffle(queue)
    rng.shuffle(queues)
    ordered: list[dict[str, Any]] = []
    while any(queues):
        for queue in queues:
            if queue:
                ordered.append(queue.pop())
    return ordered


def _prompt_length(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    return len(encode_chat(tokenizer, messages)[0])


def grpo_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[dict[str, str]] | str:
    """The prompt column GRPO samples from: the conversation, or, when it ends in an
    assistant prefill, the text that continues that turn.

    TRL's trainer renders a conversational prompt with a new assistant turn after the last
    message, so a prefill would be closed as a finished turn and the policy would answer
    after it; evaluation and serving continue the prefill instead (``encode_chat``). A text
    prompt is tokenized as it is, so training samples exactly what the policy is served.
    """
    if not messages or messages[-1]["role"] != "assistant":
        return messages
    return tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)


def build_prompt_dataset(
    tasks: Sequence[Task],
    tokenizer: Any,
    worker_descriptions: Sequence[str],
    prompt_config: PromptConfig,
    config: TrainingConfig,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One row per usable train task: ``prompt`` (conversational) plus the task columns.

    Tasks whose question exceeds ``max_question_tokens`` or whose prompt exceeds
    ``max_prompt_tokens`` are dropped (GRPO cannot truncate prompts). ``max_train_tasks``
    keeps a seeded sample. Returns the rows and a small report.
    """
    chosen = sorted(tasks, key=lambda t: t.id)
    if config.max_train_tasks is not None and len(chosen) > config.max_train_tasks:
        chosen = random.Random(config.seed).sample(chosen, config.max_train_tasks)
        chosen.sort(key=lambda t: t.id)
    rows: list[dict[str, Any]] = []
    long_questions = long_prompts = 0
    for task in chosen:
        if config.max_question_tokens is not None:
            n_question = len(tokenizer(task.question, add_special_tokens=False)["input_ids"])
            if n_question > config.max_question_tokens:
                long_questions += 1
                continue
        messages = conductor_messages(task.question, worker_descriptions, prompt_config)
        if _prompt_length(tokenizer, messages) > config.max_prompt_tokens:
            long_prompts += 1
            continue
        rows.append({"prompt": grpo_prompt(tokenizer, messages), **task_columns(task)})
    if config.grpo.balanced_domains:
        rows = interleave_domains(rows, seed=config.seed)
    report = {
        "n_tasks": len(tasks),
        "n_considered": len(chosen),
        "n_prompts": len(rows),
        "dropped_long_question": long_questions,
        "dropped_long_prompt": long_prompts,
    }
    if not rows:
        raise ValueError(
            f"no usable training prompts: {report}; raise training.max_prompt_tokens or "
            "training.max_question_tokens"
        )
    return rows, report
