"""Conversations in, reply texts out: the chat layer over :class:`LocalEngine`'s continuous
batch, shared by the local Conductor policy and the sandbox's real worker.

A conversation is encoded with the tokenizer's chat template; one that ends in an assistant
turn is continued (a prefilled reply) instead of answered. Its reply is decoded without
special tokens; the end token, when written, counts as generated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch-free at import: the Conductor policy types its calls with this module
    from conductor_pipeline.generation.local import LocalEngine

__all__ = [
    "ChatReply",
    "JoiningRow",
    "chat_continuously",
    "chat_reply",
    "encode_chat",
    "reply_text",
]

# a conversation joining a batch: (the caller's handle, messages, seed); handles are
# distinct and hashable (request objects, futures, row numbers)
JoiningRow = tuple[Any, list[dict[str, Any]], int]
# what a finished row gives: (text, prompt tokens, completion tokens, seconds since it joined)
ChatReply = tuple[str, int, int, float]


def encode_chat(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[list[int], bool]:
    """Token ids of a chat, and whether it ends in a prefilled assistant turn (which the
    model continues instead of opening a new turn)."""
    chat = [
        {"role": m.get("role", "user"), "content": str(m.get("content") or "")} for m in messages
    ]
    prefilled = bool(chat) and chat[-1]["role"] == "assistant"
    ids = tokenizer.apply_chat_template(
        chat,
        add_generation_prompt=not prefilled,
        continue_final_message=prefilled,
        return_dict=True,
    )["input_ids"]
    return list(ids), prefilled


def reply_text(tokenizer: Any, tokens: Sequence[int], prefilled: bool) -> str:
    """A reply's text: its tokens decoded without special tokens; a reply that continues a
    prefilled turn keeps its leading space."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    return text.rstrip() if prefilled else text.strip()


def chat_continuously(
    engine: LocalEngine,
    tokenizer: Any,
    first: Sequence[JoiningRow],
    temperature: float,
    max_tokens: int,
    more: Callable[[int], Sequence[JoiningRow]],
    done: Callable[[Any, ChatReply], None],
    max_guess: int,
    draw_threads: Executor | None = None,
) -> None:
    """One continuous batch of conversations: ``first``, then what ``more(rows writing)``
    returns before each pass, each finished row handed to ``done(handle, reply)`` at once
    (:meth:`LocalEngine.generate_continuously`). Returns when no row writes and ``more`` has
    nothing; both callbacks run in the calling thread."""
    writing: dict[Any, tuple[int, bool]] = {}  # handle -> (prompt tokens, prefilled)

    def encoded(joining: Sequence[JoiningRow]) -> list[tuple[Any, list[int], int]]:
        rows = []
        for handle, messages, seed in joining:
            ids, prefilled = encode_chat(tokenizer, messages)
            writing[handle] = (len(ids), prefilled)
            rows.append((handle, ids, int(seed)))
        return rows

    def finished(handle: Any, tokens: list[int], joined: float) -> None:
        prompt_tokens, prefilled = writing.pop(handle)
        text = reply_text(tokenizer, tokens, prefilled)
        done(handle, (text, prompt_tokens, len(tokens), time.perf_counter() - joined))

    engine.generate_continuously(
        encoded(first),
        float(temperature or 0.0),
        int(max_tokens),
        lambda rows: encoded(more(rows)),
        finished,
        max_guess,
        draw_threads,
    )


def chat_reply(
    engine: LocalEngine,
    tokenizer: Any,
    messages: list[dict[str, Any]],
    temperature: float,
    max_tokens: int,
    seed: int,
    max_guess: int,
) -> ChatReply:
    """One conversation's reply: a continuous batch of one row that no other row joins, so
    its text is the one it gets inside any batch (its own seeded generator), up to float
    rounding."""
    replies: list[ChatReply] = []
    chat_continuously(
        engine,
        tokenizer,
        [(0, messages, seed)],
        temperature,
        max_tokens,
        lambda _: [],
        lambda _, reply: replies.append(reply),
        max_guess,
    )
    return replies[0]
