"""The Conductor policy: any chat model that turns Conductor messages into a completion.

A local transformers model (default: SmolLM2-135M-Instruct, optionally with a LoRA adapter),
an OpenAI-compatible endpoint such as a vLLM server, and :class:`ScriptedPolicy`, no model at
all: one step to a configured worker with the question as its subtask (deterministic tests,
load benchmarks, a "route everything to worker k" baseline). Heavy imports (torch,
transformers, peft, litellm) happen on first use: importing the package stays cheap.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from conductor_pipeline.workers.local_model import MODEL_DTYPES
from conductor_pipeline.workers.torch_thread import (
    default_torch_threads,
    in_torch_thread,
    run_on_torch_thread,
    set_torch_threads,
)
from conductor_pipeline.workflow.adapter_base import DEFAULT_LOCAL_BASE, check_adapter_base

# a conversation joining a continuous batch: (the caller's handle, messages, seed)
JoiningRow = tuple[Any, list[dict[str, str]], int]


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
    """A transformers causal LM on this machine: one completion (``complete``) or a batch of
    them (``complete_many``, used by evaluation and by the API's micro-batcher), one
    generation at a time.

    ``model_dir`` is a Hugging Face model folder; ``None`` means the SmolLM2 copy that
    :func:`conductor_pipeline.workers.local_model.load_smollm2` prepares offline.
    ``adapter_dir`` is a PEFT LoRA adapter folder trained on top of it. ``torch_threads``
    caps torch's CPU threads (``None``: torch's default); one thread each keeps it and the
    sandbox's real worker from oversubscribing a small machine's cores. ``dtype``: the
    weights' precision (``float32``, ``bfloat16``, ``auto``: see :func:`model_dtype`).

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
        self._model: Any = None
        self._tokenizer: Any = None
        self._load_lock = threading.Lock()
        self._prefix: tuple[tuple[int, ...], Any] | None = None  # (token ids, their cache)
        # one generation at a time: the model is shared and CPU threads are few
        self._generate_lock = threading.Lock()
        # observability: single requests answered from the kept prompt-opening cache, and
        # forward passes (prompts included) of single requests and of batches
        self.prefix_hits = self.forward_passes = self.batch_forward_passes = 0
        # recent replies (token ids) that lookup decoding guesses from; they change how
        # fast a reply is written; what it says only up to float rounding (docs/serving.md)
        self._recent_replies: collections.deque[list[int]] = collections.deque(maxlen=32)
        self._draw_pool: Any = None  # see _draw_threads

    def load(self) -> None:
        run_on_torch_thread(self._load)

    def _load(self) -> None:
        with self._load_lock:
            if self._model is not None:
                return
            from conductor_pipeline.generation.attention import use_grouped_attention
            from conductor_pipeline.workers.local_model import load_smollm2, model_dtype

            if self.model_dir is None:
                model, tokenizer = load_smollm2()
            else:
                from transformers import AutoModelForCausalLM, AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
                model = AutoModelForCausalLM.from_pretrained(self.model_dir)
            if self.adapter_dir is not None:
                from peft import PeftModel

                # folded into the weights: the same outputs, and each decode step skips the
                # LoRA side products (about 13 % of a batch's time on one CPU thread)
                model = PeftModel.from_pretrained(model, str(self.adapter_dir)).merge_and_unload()
            model.to(model_dtype(self.dtype))  # after the merge: the adapter folds in at float32
            self.loaded_dtype = str(model.dtype).removeprefix("torch.")
            model.eval()
            use_grouped_attention(model)
            self._model, self._tokenizer = model, tokenizer

    def _generate(
        self, messages: list[dict[str, str]], temperature: float, max_tokens: int, seed: int
    ) -> PolicyCompletion:
        """One reply by lookup decoding (:mod:`~conductor_pipeline.workers.lookup_decoding`):
        the tokens plain decoding draws for ``seed``, several checked per forward pass when
        the reply repeats text seen before (``lookup_tokens`` guesses at most; 0: one token
        a pass). A prompt that continues the kept opening (:meth:`warm_up`) prefills only
        its own tokens."""
        import torch
        from transformers import DynamicCache

        from conductor_pipeline.workers.local_model import RowSampler, encode_chat
        from conductor_pipeline.workers.lookup_decoding import lookup_generate

        self.load()
        self._set_threads()
        ids, prefilled = encode_chat(self._tokenizer, messages)
        if max_tokens < 1:
            return PolicyCompletion("", len(ids), 0, 0.0)
        start = time.perf_counter()
        with self._generate_lock, torch.inference_mode():
            kept = list(self._prefix[0]) if self._prefix is not None else []
            if kept and len(ids) > len(kept) and ids[: len(kept)] == kept:
                self.prefix_hits += 1
                cache, cached = self._prefix_cache(kept, 1), len(kept)
            else:
                cache, cached = DynamicCache(), 0
            result = lookup_generate(
                self._model,
                ids,
                cache,
                cached,
                RowSampler([temperature], [seed]),
                int(max_tokens),
                self._tokenizer.eos_token_id,
                history=list(self._recent_replies),
                max_guess=self.lookup_tokens,
            )
            self._recent_replies.appendleft(result.tokens)
            self.forward_passes += result.forward_passes + 1  # + the prompt's pass
        return self._completion(result.tokens, len(ids), prefilled, time.perf_counter() - start)

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
        import torch

        from conductor_pipeline.workers.local_model import encode_chat

        self.load()
        self._set_threads()
        rows = [encode_chat(self._tokenizer, messages)[0] for messages in conversations]
        shared = _common_prefix(rows) if len(rows) > 1 else 0
        with self._generate_lock, torch.inference_mode():
            if shared >= _MIN_SHARED_PREFIX:
                self._prefix_cache(rows[0][:shared], 1)
            else:
                shared = 0
        hits = self.prefix_hits
        self._generate(conversations[0], 0.0, max_tokens, 0)
        self.prefix_hits = hits  # the warm-up is not a served request
        return shared

    async def complete(
        self, messages: list[dict[str, str]], *, temperature: float, max_tokens: int, seed: int
    ) -> PolicyCompletion:
        return await self._in_thread(self._generate, messages, temperature, max_tokens, seed)

    async def complete_many(
        self,
        conversations: list[list[dict[str, str]]],
        *,
        temperature: float,
        max_tokens: int,
        seeds: list[int],
    ) -> list[PolicyCompletion]:
        """Several completions in one batch (higher CPU throughput). Each row samples with
        its own generator seeded with its seed, so a row's text does not depend on which
        other rows share its batch (up to float rounding). ``latency_s``: the batch's time."""
        if len(seeds) != len(conversations):
            raise ValueError("complete_many: one seed per conversation")
        if not conversations:
            return []
        return await self._in_thread(
            self._generate_many, conversations, temperature, max_tokens, seeds
        )

    def _generate_many(
        self,
        conversations: list[list[dict[str, str]]],
        temperature: float,
        max_tokens: int,
        seeds: list[int],
    ) -> list[PolicyCompletion]:
        import torch

        from conductor_pipeline.workers.local_model import RowSampler, encode_chat

        self.load()
        self._set_threads()
        tokenizer = self._tokenizer
        encoded = [encode_chat(tokenizer, messages) for messages in conversations]
        rows = [ids for ids, _ in encoded]
        input_ids, attention_mask, shared = self._padded(rows)
        sampler = RowSampler([temperature] * len(rows), seeds)

        start = time.perf_counter()
        with self._generate_lock, torch.inference_mode():
            cache = self._prefix_cache(rows[0][:shared], len(rows)) if shared else None
            generated = self._decode(
                input_ids, attention_mask, cache, shared, sampler, int(max_tokens)
            )
            self._recent_replies.extendleft(generated)
        latency = time.perf_counter() - start
        return [
            self._completion(new, len(row), prefilled, latency)  # new: with its end token
            for new, row, (_, prefilled) in zip(generated, rows, encoded, strict=True)
        ]

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
        import torch

        from conductor_pipeline.workers.lookup_decoding import BatchLookupDecoder

        self.load()
        self._set_threads()
        tokenizer = self._tokenizer
        decoder = BatchLookupDecoder(
            self._model,
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
            self.lookup_tokens,
            self._draw_threads(),
        )
        # handle (the decoder's key for its row) -> (prompt tokens, prefilled, joined at)
        writing: dict[Any, tuple[int, bool, float]] = {}
        joining = list(first)
        with self._generate_lock, torch.inference_mode():
            while joining or decoder.rows:
                if joining:
                    self._join(decoder, joining, temperature, int(max_tokens), writing)
                if decoder.rows:
                    decoder.step()
                for handle, tokens in decoder.pop_finished():
                    self._recent_replies.appendleft(tokens)
                    prompt_tokens, prefilled, joined = writing.pop(handle)
                    latency = time.perf_counter() - joined
                    done(handle, self._completion(tokens, prompt_tokens, prefilled, latency))
                joining = list(more(decoder.rows))
        self.batch_forward_passes += decoder.passes + decoder.prompt_passes

    def _join(
        self,
        decoder: Any,
        joining: list[JoiningRow],
        temperature: float,
        max_tokens: int,
        writing: dict[Any, tuple[int, bool, float]],
    ) -> None:
        """Add ``joining`` to ``decoder`` (their shared opening comes from the kept cache) and
        note them in ``writing``."""
        from conductor_pipeline.workers.local_model import RowSampler, encode_chat

        joined = time.perf_counter()
        encoded = [encode_chat(self._tokenizer, messages) for _, messages, _ in joining]
        rows = [ids for ids, _ in encoded]
        input_ids, attention_mask, shared = self._padded(rows)
        cache = self._prefix_cache(rows[0][:shared], len(rows)) if shared else None
        handles = [handle for handle, _, _ in joining]
        for handle, (ids, prefilled) in zip(handles, encoded, strict=True):
            writing[handle] = (len(ids), prefilled, joined)
        sampler = RowSampler([temperature] * len(rows), [seed for _, _, seed in joining])
        decoder.join(
            input_ids,
            attention_mask,
            cache,
            shared,
            sampler,
            max_tokens,
            handles,
            history=list(self._recent_replies),
        )

    def _padded(self, rows: list[list[int]]) -> tuple[Any, Any, int]:
        """``rows`` as one padded batch ``(input_ids, attention_mask, shared)``.

        Conductor prompts share a long opening (rules, workers, examples): its keys and
        values come from a cache (:meth:`_prefix_cache`), and each row holds [shared | pads |
        own tokens] with the mask skipping the pads (positions follow the mask, so they stay
        contiguous)."""
        import torch

        pad = self._tokenizer.pad_token_id
        shared = self._shared_prefix(rows)
        width = max(len(r) for r in rows) - shared
        input_ids = torch.tensor(
            [r[:shared] + [pad] * (width - len(r) + shared) + r[shared:] for r in rows]
        )
        attention_mask = torch.tensor(
            [[1] * shared + [0] * (width - len(r) + shared) + [1] * (len(r) - shared) for r in rows]
        )
        return input_ids, attention_mask, shared

    def _completion(
        self, tokens: list[int], prompt_tokens: int, prefilled: bool, latency: float
    ) -> PolicyCompletion:
        text = self._tokenizer.decode(tokens, skip_special_tokens=True)
        text = text.rstrip() if prefilled else text.strip()
        return PolicyCompletion(text, prompt_tokens, len(tokens), latency)

    def _decode(
        self,
        input_ids: Any,
        attention_mask: Any,
        cache: Any,
        shared: int,
        sampler: Any,
        max_tokens: int,
    ) -> list[list[int]]:
        """Sample up to ``max_tokens`` tokens per row of a padded batch whose first ``shared``
        tokens are in ``cache``; a row's list ends with the end token when it wrote one.

        Batched lookup decoding (:mod:`~conductor_pipeline.workers.lookup_decoding`): each
        row draws with its own sampler (the same draws, so the same text) and leaves the
        batch when done, where ``generate`` would run every row as long as the longest.
        """
        from conductor_pipeline.workers.lookup_decoding import lookup_decode_batch

        result = lookup_decode_batch(
            self._model,
            input_ids,
            attention_mask,
            cache,
            shared,
            sampler,
            max_tokens,
            self._tokenizer.eos_token_id,
            self._tokenizer.pad_token_id,
            history=list(self._recent_replies),
            max_guess=self.lookup_tokens,
            draw_threads=self._draw_threads(),
        )
        self.batch_forward_passes += result.forward_passes + 1  # + the prompts' pass
        return result.tokens

    def _draw_threads(self) -> Any:
        """Threads for a batch's rows to draw their tokens side by side (None with one CPU
        thread, e.g. evaluation's ``torch_threads: 1``, which leaves the other core to the
        sandbox worker). A draw thread runs torch on one thread: an OpenMP team of its own
        would slow every thread (:mod:`~conductor_pipeline.workers.torch_thread`)."""
        import torch

        threads = self.torch_threads or torch.get_num_threads()
        if threads < 2:
            return None
        if self._draw_pool is None:
            self._draw_pool = ThreadPoolExecutor(
                threads,
                thread_name_prefix="conductor-draw",
                initializer=set_torch_threads,
                initargs=(1,),
            )
        return self._draw_pool

    async def _in_thread(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)`` off the event loop: on the torch thread, unless the policy runs on
        one CPU thread (no OpenMP team: evaluation's policies generate side by side)."""
        if self.torch_threads == 1:
            return await asyncio.to_thread(work, *args)
        return await in_torch_thread(work, *args)

    def _set_threads(self) -> None:
        # policies with different thread counts share the torch thread: each sets its own
        set_torch_threads(self.torch_threads or default_torch_threads())

    def _shared_prefix(self, rows: list[list[int]]) -> int:
        """How many leading tokens come from a cache: the kept opening when every row starts
        with it, else the rows' common opening when long enough (0: no cache)."""
        common = _common_prefix(rows)
        if self._prefix is not None:
            kept = self._prefix[0]
            if len(kept) <= common and tuple(rows[0][: len(kept)]) == kept:
                return len(kept)
        return common if common >= _MIN_SHARED_PREFIX and len(rows) > 1 else 0

    def _prefix_cache(self, prefix: list[int], batch: int) -> Any:
        """The keys and values of ``prefix`` for ``batch`` rows (computed on first use, then
        kept): views of the kept tensors, not copies, which no pass writes to
        (:func:`~conductor_pipeline.generation.kv_cache.cache_from`)."""
        import torch

        from conductor_pipeline.generation.kv_cache import cache_from

        key = tuple(prefix)
        if self._prefix is None or self._prefix[0] != key:
            out = self._model(input_ids=torch.tensor([prefix]), use_cache=True)
            self._prefix = (key, out.past_key_values)
        return cache_from([(kept.keys, kept.values) for kept in self._prefix[1].layers], batch)


# a shared opening shorter than this is not worth a separate cache
_MIN_SHARED_PREFIX = 32


def _common_prefix(rows: list[list[int]]) -> int:
    """Tokens all rows start with, leaving every row at least one token of its own."""
    n = min(len(r) for r in rows) - 1
    k = 0
    while k < n and all(r[k] == rows[0][k] for r in rows):
        k += 1
    return max(k, 0)


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
