"""The sandbox's real workers: SmolLM2-135M-Instruct, loaded in a background thread and
answering concurrent requests in shared batches (the sandbox server's real-worker path)."""

from __future__ import annotations

import faulthandler
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from conductor_pipeline.generation.batching import take_queued
from conductor_pipeline.workers.local_model import LOOKUP_TOKENS
from conductor_pipeline.workers.sandbox.profiles import RealProfile
from conductor_pipeline.workers.torch_thread import set_torch_threads

log = logging.getLogger(__name__)


# a queued request: (messages, token limit, temperature, seed, its reply's future)
_Request = tuple[list[dict[str, Any]], int, float, int, Future]


class RealWorkers:
    """Loads SmolLM2 in a background thread and answers its requests in batches.

    A batch is continuous: the oldest queued request opens it, and queued requests with
    its temperature and token limit join it between two decoding passes while it writes
    fewer than ``max_batch`` rows; each reply is sent as soon as its row is done. Concurrent
    callers so share the model's forward passes (on one CPU core a pass over 8 rows costs
    little more than over one) without waiting for a whole batch to start or end. Each row
    keeps its own seed (:func:`~conductor_pipeline.generation.chat.chat_continuously`, the
    generation engine's; its guesses come from earlier replies too when the model runs in
    float32, and from each request's own tokens only in bfloat16). Measured alone on 2
    cores (docs/sandbox.md): 153 short questions, 32 tokens each, 8 in flight, took 61 s
    this way against 77 s in batches that closed when they started; 16 in flight, 45 s.

    ``concurrency`` batches generate at once, each on a thread and an engine of its own over
    the one model (its weights are only read), with ``torch_threads`` threads each. A
    batch's passes are single-threaded work that never waits on another thread, so two
    batches on one thread each keep two cores busy: on a 2-core CPU, two batches of 8 took
    4.6 s together against 9.3 s one after the other, with the same texts. When the pipeline
    computes on a core meanwhile, the three threads share the cores, instead of two threads
    of one operation spinning while the other is descheduled (one batch on two torch threads
    took 7.7 s then, against 4.4 s on one).

    A batch also holds at most ``max_batch_chars`` of prompt counted as if every row were as
    long as its longest (rows times the longest prompt's characters); the oldest request
    always opens the next batch, the others wait while they would overflow it. Before the
    engine passed over prompts in groups of similar length, one 2,800-token aggregation
    prompt padded seven short ones to its length: the batch took 135 s under make run's load,
    past every caller's 120 s timeout, and their retries formed the same batch again, and
    again. The bound stays: every decoding pass attends over the widest row's columns.
    """

    def __init__(
        self,
        profiles: Sequence[RealProfile],
        cache_dir: Path | None,
        torch_threads: int | None,
        max_batch: int = 8,
        max_batch_chars: int = 24_000,
        concurrency: int = 1,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if max_batch_chars < 1:
            raise ValueError("max_batch_chars must be >= 1")
        dtypes = {p.dtype for p in profiles}
        if len(dtypes) > 1:  # one model answers for every real profile
            raise ValueError(f"the real workers share one model: give them one dtype, not {dtypes}")
        self.dtype = dtypes.pop() if dtypes else "float32"
        self.loaded_dtype: str | None = None
        self.profiles = {p.name: p for p in profiles}
        # a batch that outlives its callers' timeout is a problem, not load: every caller
        # retries. Its threads' stacks are dumped to the log once it has run this long, and
        # it is logged with its prompt sizes if it ends
        self.slow_batch_s = min((p.timeout_s for p in profiles), default=120.0)
        self.cache_dir = cache_dir
        self.torch_threads = torch_threads
        self.max_batch = max_batch
        self.max_batch_chars = max_batch_chars
        self.concurrency = concurrency
        self.model: Any = None
        self.tokenizer: Any = None
        self.engines: list[Any] = []  # one generation engine per concurrent batch
        self.error: str | None = None
        self.ready = threading.Event()
        self.load_seconds: float | None = None
        self.batch_sizes: list[int] = []  # rows each batch served, for tests and /health
        self.abandoned = 0  # queued requests whose caller went away before their batch
        self._pending: list[_Request] = []
        self._wakeup = threading.Condition()
        self._thread: threading.Thread | None = None
        self._batchers: list[threading.Thread] = []

    def start_loading(self) -> None:
        if self._thread is None and not self.ready.is_set():
            self._thread = threading.Thread(
                target=self._load, name="sandbox-model-load", daemon=True
            )
            self._thread.start()

    def _load(self) -> None:
        import torch

        from conductor_pipeline.generation.attention import use_grouped_attention
        from conductor_pipeline.generation.local import REPLY_HISTORY, LocalEngine
        from conductor_pipeline.workers.local_model import load_smollm2

        started = time.perf_counter()
        try:
            self._set_threads()
            self.model, self.tokenizer = load_smollm2(self.cache_dir, self.dtype)
            # the engine's one attention, as a served Conductor's: packed decoding passes
            # and key/value heads the kernel groups, instead of transformers' copies
            use_grouped_attention(self.model)
            # its replies are scored and cached: in bfloat16 they guess from each request's
            # own tokens only, so that what a worker answers does not depend on the calls
            # before it (float32 rounds alike often enough to keep earlier replies)
            history = REPLY_HISTORY if self.model.dtype == torch.float32 else 0
            self.engines = [
                LocalEngine.for_tokenizer(self.model, self.tokenizer, history)
                for _ in range(self.concurrency)
            ]
            self.loaded_dtype = self.engines[0].dtype_name
            self.load_seconds = time.perf_counter() - started
            log.info("sandbox: SmolLM2 loaded in %.1f s (%s)", self.load_seconds, self.loaded_dtype)
        except Exception as exc:  # reported through /health
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("sandbox: loading SmolLM2 failed")
        finally:
            self.ready.set()

    def submit(
        self, messages: list[dict[str, Any]], max_new_tokens: int, temperature: float, seed: int
    ) -> Future:
        """Queue one reply; the future resolves to ``(text, prompt_tokens, completion_tokens)``."""
        future: Future = Future()
        with self._wakeup:
            if not self._batchers:
                self._batchers = [
                    threading.Thread(
                        target=self._serve_batches,
                        args=(k,),
                        name=f"sandbox-model-batches-{k}",
                        daemon=True,
                    )
                    for k in range(self.concurrency)
                ]
                for batcher in self._batchers:
                    batcher.start()
            self._pending.append((messages, max_new_tokens, temperature, seed, future))
            self._wakeup.notify()
        return future

    def _serve_batches(self, k: int) -> None:
        """Batcher ``k``: whenever its last batch is done, the oldest queued request opens
        the next one."""
        self._set_threads()
        while True:
            with self._wakeup:
                while not self._pending:
                    self._wakeup.wait()
                writing: dict[int, int] = {}
                first = self._take(self.max_batch, writing)
            if first:
                self._generate(k, first, writing)

    def _generate(self, k: int, first: list[_Request], writing: dict[int, int]) -> None:
        """One continuous batch on engine ``k``: ``first``, then the queued requests with its
        temperature and token limit, joining between passes while it has room. ``writing``:
        the prompt characters of its rows, by id of their future (:meth:`_take`)."""
        from conductor_pipeline.generation import chat

        temperature, limit = first[0][2], first[0][1]
        members = list(first)
        watchdog = BatchWatchdog(self.slow_batch_s, lambda: _dump_stacks(len(writing)))

        def more(rows: int) -> list[tuple[Future, list[dict[str, Any]], int]]:
            with self._wakeup:
                joining = self._take(self.max_batch - rows, writing, (limit, temperature))
            members.extend(joining)
            return [(entry[-1], entry[0], entry[3]) for entry in joining]

        def done(future: Future, reply: tuple[str, int, int, float]) -> None:
            text, prompt_tokens, completion_tokens, seconds = reply
            rows = len(writing)
            writing.pop(id(future), None)
            watchdog.progress()
            if seconds > self.slow_batch_s:
                log.warning(
                    "sandbox: a SmolLM2 reply took %.0f s in a batch of %d rows (prompt tokens %d)",
                    seconds,
                    rows,
                    prompt_tokens,
                )
            future.set_result((text, prompt_tokens, completion_tokens))

        try:
            chat.chat_continuously(
                self.engines[k] if self.engines else None,
                self.tokenizer,
                [(entry[-1], entry[0], entry[3]) for entry in first],
                temperature,
                limit,
                more,
                done,
                LOOKUP_TOKENS,
            )
        except Exception as exc:  # each waiting request gets the error, the loop goes on
            log.exception("sandbox: SmolLM2 generation failed for a batch of %d", len(members))
            for *_, future in members:
                if not future.done():
                    future.set_exception(exc)
        finally:
            watchdog.stop()
        self.batch_sizes.append(len(members))

    def _take(
        self, room: int, writing: dict[int, int], key: tuple[int, float] | None = None
    ) -> list[_Request]:
        """Queued requests for a batch (the caller holds ``_wakeup``), at most ``room``, by
        the engine's one queue rule (:func:`take_queued`; ``key``: a running batch's token
        limit and temperature, ``None`` to open one). A request waits while it would push
        the padded prompt (rows times the longest prompt's characters) past
        ``max_batch_chars``; ``writing`` holds the characters of the batch's rows (id of
        their future), those taken are added."""

        def admit(entry: _Request) -> bool | None:
            size = _prompt_chars(entry[0])
            if (
                writing
                and max([size, *writing.values()]) * (len(writing) + 1) > self.max_batch_chars
            ):
                return False  # waits for a later batch
            # False: the request was cancelled (its caller went away) while queued
            if not entry[-1].set_running_or_notify_cancel():
                self.abandoned += 1
                return None
            writing[id(entry[-1])] = size
            return True

        return take_queued(self._pending, room, _settings, key, admit)

    def _set_threads(self) -> None:
        # Per calling thread: OpenMP keeps the thread count per thread, and generation runs
        # in its own thread.
        if self.torch_threads:
            set_torch_threads(self.torch_threads)


def _settings(entry: _Request) -> tuple[int, float]:
    return entry[1], entry[2]  # token limit, temperature


def _prompt_chars(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content") or "")) for m in messages)


class BatchWatchdog:
    """Calls ``stalled`` when ``progress`` has not been called for ``timeout_s`` (from the
    start on), once per stall, on a thread of its own until ``stop``. One per batch:
    faulthandler's ``dump_traceback_later`` is one timer per process, which any other batch
    would reset."""

    def __init__(self, timeout_s: float, stalled: Callable[[], None]) -> None:
        self.timeout_s, self.stalled = timeout_s, stalled
        self._last = time.monotonic()
        self._stopped = threading.Event()
        thread = threading.Thread(target=self._watch, name="sandbox-batch-watchdog", daemon=True)
        thread.start()

    def progress(self) -> None:
        self._last = time.monotonic()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        reported = None  # the last progress before the stall already reported
        while not self._stopped.wait(self._until_due()):
            last = self._last
            if last != reported and time.monotonic() - last >= self.timeout_s:
                self.stalled()
                reported = last

    def _until_due(self) -> float:
        due = self._last + self.timeout_s - time.monotonic()
        return due if due > 0 else self.timeout_s


def _dump_stacks(rows: int) -> None:
    """Every thread's stack on stderr: where a batch that outlived its callers is stuck."""
    sys.stderr.write(f"sandbox: a SmolLM2 batch of {rows} outlived its callers' timeout\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
