"""The sandbox's real workers: SmolLM2-135M-Instruct, loaded in a background thread and
answering concurrent requests in shared batches (the sandbox server's real-worker path)."""

from __future__ import annotations

import faulthandler
import logging
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from conductor_pipeline.workers.sandbox.profiles import RealProfile
from conductor_pipeline.workers.torch_thread import set_torch_threads

log = logging.getLogger(__name__)


class RealWorkers:
    """Loads SmolLM2 in a background thread and answers its requests in batches.

    Requests that arrive while a batch is generating wait for the next one (at most
    ``max_batch`` rows), so concurrent callers share the model's forward passes: on one CPU
    core a batch of 8 replies of 32 tokens costs about as much as 3 single ones. Each row
    keeps its own seed, temperature and token limit (``generate_chat_batch``, through the
    generation engine; its guesses come from earlier replies too when the model runs in
    float32, and from each request's own tokens only in bfloat16).

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
    always goes into the next batch, the others wait if they would overflow it. Before the
    engine passed over prompts in groups of similar length, one 2,800-token aggregation
    prompt padded seven short ones to its length: the batch took 135 s under make run's load,
    past every caller's 120 s timeout, and their retries formed the same batch again, and
    again. The bound stays: a batch's rows still decode together until the last is done.
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
        self.batch_sizes: list[int] = []  # one entry per generate call, for tests and /health
        self.abandoned = 0  # queued requests whose caller went away before their batch
        self._pending: list[tuple[list[dict[str, Any]], int, float, int, Future]] = []
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

        from conductor_pipeline.generation.local import REPLY_HISTORY, LocalEngine
        from conductor_pipeline.workers.local_model import load_smollm2

        started = time.perf_counter()
        try:
            self._set_threads()
            self.model, self.tokenizer = load_smollm2(self.cache_dir, self.dtype)
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
        """Batcher ``k``: takes the next batch off the queue whenever its last one is done."""
        from conductor_pipeline.workers.local_model import generate_chat_batch

        self._set_threads()
        while True:
            with self._wakeup:
                while not self._pending:
                    self._wakeup.wait()
                batch = self._take_batch()
                if not batch:
                    continue
            started = time.perf_counter()
            # a timer of this batch's own: faulthandler's dump_traceback_later is one timer
            # per process, which any other batcher's end would cancel
            watchdog = threading.Timer(self.slow_batch_s, _dump_stacks, (len(batch),))
            watchdog.daemon = True
            watchdog.start()
            try:
                replies = generate_chat_batch(
                    self.model,
                    self.tokenizer,
                    [b[0] for b in batch],
                    [b[1] for b in batch],
                    [b[2] for b in batch],
                    [b[3] for b in batch],
                    engine=self.engines[k] if self.engines else None,
                )
            except Exception as exc:  # each waiting request gets the error, the loop goes on
                log.exception("sandbox: SmolLM2 generation failed for a batch of %d", len(batch))
                for *_, future in batch:
                    future.set_exception(exc)
                continue
            finally:
                watchdog.cancel()
            self.batch_sizes.append(len(batch))
            seconds = time.perf_counter() - started
            if seconds > self.slow_batch_s:
                prompt_tokens = [reply[1] for reply in replies]
                log.warning(
                    "sandbox: a SmolLM2 batch of %d took %.0f s (prompt tokens %s)",
                    len(batch),
                    seconds,
                    prompt_tokens,
                )
            for (*_, future), reply in zip(batch, replies, strict=True):
                future.set_result(reply)

    def _take_batch(self) -> list[tuple[list[dict[str, Any]], int, float, int, Future]]:
        """The next batch from the queue (the caller holds ``_wakeup``): the oldest request,
        then the next ones that keep the padded prompt within ``max_batch_chars``."""
        batch: list[tuple[list[dict[str, Any]], int, float, int, Future]] = []
        longest = 0
        i = 0
        while i < len(self._pending) and len(batch) < self.max_batch:
            entry = self._pending[i]
            size = _prompt_chars(entry[0])
            if batch and max(longest, size) * (len(batch) + 1) > self.max_batch_chars:
                i += 1  # waits for a later batch
                continue
            self._pending.pop(i)
            # False: the request was cancelled (its caller went away) while queued
            if entry[-1].set_running_or_notify_cancel():
                batch.append(entry)
                longest = max(longest, size)
            else:
                self.abandoned += 1
        return batch

    def _set_threads(self) -> None:
        # Per calling thread: OpenMP keeps the thread count per thread, and generation runs
        # in its own thread.
        if self.torch_threads:
            set_torch_threads(self.torch_threads)


def _prompt_chars(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content") or "")) for m in messages)


def _dump_stacks(rows: int) -> None:
    """Every thread's stack on stderr: where a batch that outlived its callers is stuck."""
    sys.stderr.write(f"sandbox: a SmolLM2 batch of {rows} outlived its callers' timeout\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
