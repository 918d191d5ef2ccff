"""The Conductor policy: any chat model that turns Conductor messages into a completion.

A local transformers model (default: SmolLM2-135M-Instruct, optionally with a LoRA adapter),
an OpenAI-compatible endpoint such as a vLLM server, and :class:`ScriptedPolicy`, no model at
all: one step to a configured worker with the question as its subtask (deterministic tests,
load benchmarks, a "route everything to worker k" baseline). Heavy imports (torch,
transformers, peft, litellm) happen on first use: importing the package stays cheap.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from conductor_pipeline.generation.chat import (
    JoiningRow,
    chat_continuously,
    chat_reply,
    encode_chat,
)
from conductor_pipeline.workers.local_model import MODEL_DTYPES
from conductor_pipeline.workers.torch_thread import (
    default_torch_threads,
    in_torch_thread,
    run_on_torch_thread,
    set_torch_threads,
)
from conductor_pipeline.workflow.adapter_base import DEFAULT_LOCAL_BASE, check_adapter_base


@dataclass
class PolicyCompletion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float


class ConductorPolicy(Protocol):
    """What orchestration needs from a Conductor model."""

    name: str

    async def complete(
        self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int, seed: int
    ) -> PolicyCompletion: ...


class LocalPolicy:
    """A transformers causal LM on this machine: one completion (``complete``) or a batch
    that conversations join and leave (``complete_continuously``, the micro-batcher's of
    evaluation and the API), one generation at a time.

    ``model_dir`` is a Hugging Face model folder; ``None`` means the SmolLM2 copy that
    :func:`conductor_pipeline.workers.local_model.load_smollm2` prepares offline.
    ``adapter_dir`` is a PEFT LoRA adapter folder trained on top of it. ``torch_threads``
    caps torch's CPU threads (``None``: torch's default); one thread each keeps it and the
    sandbox's real worker from oversubscribing a small machine's cores. ``dtype``: the
    weights' precision (``float32``, ``bfloat16``, ``auto``: see :func:`model_dtype`).
    ``lookup_tokens``: the most tokens lookup decoding guesses a pass (0: one token a pass).

    This class loads the model and runs it on the torch thread; conversations become token
    ids and texts in the engine's chat layer (:mod:`~conductor_pipeline.generation.chat`,
    which the sandbox's real worker uses too), and generation itself is the engine's
    (:class:`~conductor_pipeline.generation.local.LocalEngine`), whose one decode loop serves
    single requests, batches and continuous batches alike. Once loaded, ``model``,
    ``tokenizer`` and ``engine`` are that model, its tokenizer and its engine (``None``
    before :meth:`load`).

    Loading, warm-up and generation run on the process's torch thread, whichever thread asks
    (:mod:`~conductor_pipeline.workers.torch_thread` says why); on one CPU thread a policy
    runs no parallel operation and generates in any thread.
    """

    def __init__(
        self,
        model_dir: str | Path | None = None,
        adapter_dir: str | Path | None = None,
        name: str | None = None,
        torch_threads: int | None = None,
        lookup_tokens: int = 8,
        dtype: str = "float32",
    ):
        if torch_threads is not None and torch_threads < 1:
            raise ValueError(f"LocalPolicy: torch_threads must be >= 1, got {torch_threads}")
        if (
            isinstance(lookup_tokens, bool)
            or not isinstance(lookup_tokens, int)
            or lookup_tokens < 0
        ):
            raise ValueError(
                f"LocalPolicy: lookup_tokens must be an integer >= 0, got {lookup_tokens!r}"
            )
        if dtype not in MODEL_DTYPES:
            raise ValueError(f"LocalPolicy: dtype must be one of {MODEL_DTYPES}, got {dtype!r}")
        self.lookup_tokens, self.dtype = lookup_tokens, dtype
        self.loaded_dtype: str | None = None  # what ``dtype`` resolved to, once loaded
        self.torch_threads = torch_threads
        self.model_dir = Path(model_dir) if model_dir else None
        self.adapter_dir = Path(adapter_dir) if adapter_dir else None
        if self.adapter_dir is not None:
            # before any weight is read: PEFT would mount a same-shaped stranger silently
            check_adapter_base(
                self.adapter_dir,
                str(self.model_dir) if self.model_dir else DEFAULT_LOCAL_BASE,
                where="local Conductor policy",
            )
        self.name = name or (
            f"local:{self.adapter_dir.name}" if self.adapter_dir else "local:smollm2-135m-instruct"
        )
        # set by load(): the transformers model, its tokenizer and the LocalEngine over them
        self.model: Any = None
        self.tokenizer: Any = None
        self.engine: Any = None
        self._load_lock = threading.Lock()

    # observability: prompt passes that started from the kept prompt-opening cache, and
    # forward passes (prompts included)
    @property
    def prefix_hits(self) -> int:
        return self.engine.prefix_hits if self.engine is not None else 0

    @property
    def forward_passes(self) -> int:
        return self.engine.forward_passes if self.engine is not None else 0

    def load(self) -> None:
        run_on_torch_thread(self._load)

    def _load(self) -> None:
        with self._load_lock:
            if self.model is not None:
                return
            from conductor_pipeline.generation.attention import use_grouped_attention
            from conductor_pipeline.generation.local import LocalEngine
            from conductor_pipeline.workers.local_model import (
                load_pretrained,
                load_smollm2,
                model_dtype,
            )

            if self.model_dir is None:
                model, tokenizer = load_smollm2()
            else:
                model, tokenizer = load_pretrained(self.model_dir)
            if self.adapter_dir is not None:
                from peft import PeftModel

                # folded into the weights: the same outputs, and each decode step skips the
                # LoRA side products (about 13 % of a batch's time on one CPU thread)
                model = PeftModel.from_pretrained(model, str(self.adapter_dir)).merge_and_unload()
            model.to(model_dtype(self.dtype))  # after the merge: the adapter folds in at float32
            model.eval()
            use_grouped_attention(model)
            self.engine = LocalEngine.for_tokenizer(model, tokenizer)
            self.loaded_dtype = self.engine.dtype_name
            self.model, self.tokenizer = model, tokenizer

    def _generate(
        self, messages: list[dict[str, str]], temperature: float, max_tokens: int, seed: int
    ) -> PolicyCompletion:
        """One reply: the tokens plain decoding draws for ``seed``, several checked per
        forward pass when the reply repeats text seen before. A prompt that continues the
        kept opening (:meth:`warm_up`) prefills only its own tokens."""
        self.load()
        self._set_threads()
        reply = chat_reply(
            self.engine,
            self.tokenizer,
            messages,
            temperature,
            max_tokens,
            seed,
            self.lookup_tokens,
        )
        return PolicyCompletion(*reply)

    def warm_up(self, conversations: list[list[dict[str, str]]], max_tokens: int = 4) -> int:
        """Prepare for serving: load the model, keep the key/value cache of the opening that
        ``conversations`` share (e.g. two planning prompts for different questions: rules and
        workers, everything before the question), and run one short generation so the first
        real request does not pay for lazy initialisation. Later single requests that start
        with that opening prefill only their own tokens. Returns the kept opening's length
        in tokens (0: the conversations share too little to be worth a cache)."""
        if not conversations:
            raise ValueError("LocalPolicy.warm_up: needs at least one conversation")
        return run_on_torch_thread(self._warm_up, conversations, max_tokens)

    def _warm_up(self, conversations: list[list[dict[str, str]]], max_tokens: int) -> int:
        self.load()
        self._set_threads()
        hits = self.engine.prefix_hits
        shared = self.engine.keep_opening(
            [encode_chat(self.tokenizer, m)[0] for m in conversations]
        )
        self._generate(conversations[0], 0.0, max_tokens, 0)
        self.engine.prefix_hits = hits  # the warm-up is not a served request
        return shared

    async def complete(
        self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int, seed: int
    ) -> PolicyCompletion:
        return await self._in_thread(self._generate, messages, temperature, max_tokens, seed)

    async def complete_continuously(
        self,
        first: list[JoiningRow],
        *,
        temperature: float,
        max_tokens: int,
        more: Callable[[int], list[JoiningRow]],
        done: Callable[[Any, PolicyCompletion], None],
    ) -> None:
        """One batch that conversations join and leave between decoding passes (continuous
        batching, for the API's micro-batcher).

        ``first`` and what ``more(rows_writing)`` returns are ``(handle, messages, seed)``
        (handles: distinct and hashable, e.g. the caller's request objects); ``more`` is
        asked before every pass. Each completion goes to ``done(handle, ...)`` as soon as its
        row has finished, not when the batch does; its ``latency_s`` runs from its row's
        joining. The call returns once no row is writing and ``more`` has nothing.
        Every row samples with its own seeded generator, so a conversation gets the text it
        gets from :meth:`complete` (up to float rounding). Both callbacks run in the
        generation thread.
        """
        await self._in_thread(
            self._generate_continuously, first, temperature, max_tokens, more, done
        )

    def _generate_continuously(
        self,
        first: list[JoiningRow],
        temperature: float,
        max_tokens: int,
        more: Callable[[int], list[JoiningRow]],
        done: Callable[[Any, PolicyCompletion], None],
    ) -> None:
        self.load()
        self._set_threads()
        chat_continuously(
            self.engine,
            self.tokenizer,
            first,
            temperature,
            max_tokens,
            more,
            lambda handle, reply: done(handle, PolicyCompletion(*reply)),
            self.lookup_tokens,
            self._draw_threads(),
        )

    def _draw_threads(self) -> Any:
        """Threads for a batch's rows to draw their tokens side by side (None with one CPU
        thread, e.g. evaluation's ``torch_threads: 1``, which leaves the other core to the
        sandbox worker). A draw thread runs torch on one thread: an OpenMP team of its own
        would slow every thread (:mod:`~conductor_pipeline.workers.torch_thread`)."""
        import torch

        threads = self.torch_threads or torch.get_num_threads()
        return self.engine.draw_pool(threads, lambda: set_torch_threads(1))

    async def _in_thread(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)`` off the event loop: on the torch thread, unless the policy runs on
        one CPU thread (no OpenMP team: evaluation's policies generate side by side)."""
        if self.torch_threads == 1:
            return await asyncio.to_thread(work, *args)
        return await in_torch_thread(work, *args)

    def _set_threads(self) -> None:
        # policies with different thread counts share the torch thread: each sets its own
        set_torch_threads(self.torch_threads or default_torch_threads())


class EndpointPolicy:
    """A Conductor served behind an OpenAI-compatible API (e.g. ``vllm serve --enable-lora``).

    ``model`` is a litellm model string such as ``hosted_vllm/conductor`` (the LoRA adapter's
    served name); the key, if any, comes from the caller (credentials or environment).
    """

    def __init__(
        self, model: str, api_base: str, api_key: str | None = None, timeout_s: float = 120.0
    ):
        self.model, self.api_base, self.timeout_s = model, api_base, timeout_s
        self._api_key = api_key
        self.name = model

    def __repr__(self) -> str:  # never print the key
        return f"EndpointPolicy(model={self.model!r}, api_base={self.api_base!r})"

    async def complete(
        self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int, seed: int
    ) -> PolicyCompletion:
        import litellm

        start = time.perf_counter()
        extra: dict[str, Any] = {}
        if messages and messages[-1]["role"] == "assistant":
            # vLLM continues a prefilled assistant turn only when told to
            extra["extra_body"] = {"continue_final_message": True, "add_generation_prompt": False}
        response = await litellm.acompletion(
            model=self.model,
            api_base=self.api_base,
            api_key=self._api_key or "none",
            messages=messages,
            temperature=temperature,
            max_tokens=max_tokens,
            seed=seed,
            timeout=self.timeout_s,
            **extra,
        )
        text = response.choices[0].message.content or ""
        usage = getattr(response, "usage", None)
        return PolicyCompletion(
            text=text,
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            latency_s=time.perf_counter() - start,
        )


class ScriptedPolicy:
    """A rule, not a model: every question gets the same one-step workflow.

    The step sends the question itself (as it appears at the end of the Conductor prompt,
    cropped to ``max_subtask_chars``) to worker ``worker``, seeing nothing else. In a
    recursion round it keeps the previous answer (three empty lists). Its output continues
    the assistant prefill when the prompt carries one, exactly as a model would. Replies
    are deterministic and instant; token counts are zero (no model ran).

    Use it as a baseline ("always ask worker k") or to exercise serving, tests and
    benchmarks without a model; it is not a trained Conductor.
    """

    QUESTION_MARKER = "Question: "

    def __init__(self, worker: int = 0, max_subtask_chars: int = 4000) -> None:
        if isinstance(worker, bool) or not isinstance(worker, int) or worker < 0:
            raise ValueError(f"ScriptedPolicy: worker must be an index >= 0, got {worker!r}")
        self.worker = worker
        self.max_subtask_chars = max_subtask_chars
        self.name = f"scripted:worker-{worker}"

    def _question(self, messages: list[dict[str, str]]) -> str:
        first_user = next((m for m in messages if m["role"] == "user"), None)
        text = str(first_user["content"]) if first_user else ""
        # the planning prompt ends with a paragraph "Question: <question>"; the first such
        # paragraph is it (few-shot examples put "Question:" mid-paragraph)
        at = text.find("\n\n" + self.QUESTION_MARKER)
        at = at + 2 if at >= 0 else text.rfind(self.QUESTION_MARKER)
        question = text[at + len(self.QUESTION_MARKER) :] if at >= 0 else text
        return question.strip()[: self.max_subtask_chars].strip() or "(empty question)"

    def workflow_text(self, messages: list[dict[str, str]]) -> str:
        if sum(m["role"] == "user" for m in messages) > 1:  # a recursion round: keep the answer
            return "model_id = []\nsubtasks = []\naccess_list = []"
        subtask = json.dumps([self._question(messages)])
        return f"model_id = [{self.worker}]\nsubtasks = {subtask}\naccess_list = [[]]"

    async def complete(
        self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int, seed: int
    ) -> PolicyCompletion:
        text = self.workflow_text(messages)
        prefill = (
            messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else ""
        )
        if prefill:
            # continue the prefill: the orchestrator parses prefill + completion
            text = text[len(prefill) :] if text.startswith(prefill) else "\n" + text
        return PolicyCompletion(text, 0, 0, 0.0)
