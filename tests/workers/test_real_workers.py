"""The sandbox's real-worker batcher: requests join a running batch with its settings, and
requests whose caller went away are skipped (a reply nobody waits for is never generated,
so a caller's timeout and retry do not queue the same work twice behind a slow batch)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

import httpx
import pytest
import uvicorn

from conductor_pipeline.generation.attention import supports_packed_rows
from conductor_pipeline.generation.local import REPLY_HISTORY
from conductor_pipeline.workers import local_model
from conductor_pipeline.workers.sandbox import load_profiles
from conductor_pipeline.workers.sandbox.profiles import default_profiles_path
from conductor_pipeline.workers.sandbox.real_workers import RealWorkers
from conductor_pipeline.workers.sandbox.server import create_app

PROFILES = load_profiles(default_profiles_path())
REAL = PROFILES.real[0].name


class HeldGenerator:
    """Stands in for ``chat_continuously``: the first batch waits for ``release``; a batch
    takes joiners (``more``) only when ``joins`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.batches: list[list[str]] = []
        self.joins = False

    def __call__(self, engine, tokenizer, first, temperature, limit, more, done, max_guess):
        started = time.perf_counter()
        rows = list(first)
        self.batches.append([messages[-1]["content"] for _, messages, _ in rows])
        if len(self.batches) == 1:
            assert self.release.wait(30), "the test never released the first batch"
        if self.joins:
            joining = list(more(len(rows)))
            self.batches[-1] += [messages[-1]["content"] for _, messages, _ in joining]
            rows += joining
        for handle, messages, _ in rows:
            seconds = time.perf_counter() - started
            done(handle, (f"reply to {messages[-1]['content']}", 3, 2, seconds))


@pytest.fixture
def held(monkeypatch) -> HeldGenerator:
    from conductor_pipeline.generation import chat

    generator = HeldGenerator()
    monkeypatch.setattr(chat, "chat_continuously", generator)
    return generator


def _wait_until(condition, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.02)


def _ask(workers: RealWorkers, text: str) -> Future:
    return workers.submit([{"role": "user", "content": text}], 8, 0.0, 0)


def test_a_cancelled_request_is_skipped_by_the_next_batch(held):
    workers = RealWorkers(PROFILES.real, None, None, max_batch=8)
    first = _ask(workers, "first")
    _wait_until(lambda: held.batches, "the first batch")
    gone, kept = _ask(workers, "gone"), _ask(workers, "kept")
    assert gone.cancel()  # still queued: cancellable
    held.release.set()
    assert first.result(10)[0] == "reply to first" and kept.result(10)[0] == "reply to kept"
    assert held.batches == [["first"], ["kept"]] and workers.abandoned == 1


def test_requests_with_the_batchs_settings_join_it_while_it_writes(held):
    held.joins = True
    workers = RealWorkers(PROFILES.real, None, None, max_batch=4)
    first = _ask(workers, "first")
    _wait_until(lambda: held.batches, "the first batch")
    joiners = [_ask(workers, f"join {i}") for i in range(2)]
    other_limit = workers.submit([{"role": "user", "content": "longer"}], 16, 0.0, 0)
    late = _ask(workers, "late")
    held.release.set()
    replies = [f.result(10)[0] for f in (first, *joiners, other_limit, late)]
    assert replies == [f"reply to {t}" for t in ("first", "join 0", "join 1", "longer", "late")]
    # the batch has room for one more, but "late" queued behind another token limit: it
    # waits, so that the other limit's request opens the next batch instead of starving
    assert held.batches == [["first", "join 0", "join 1"], ["longer"], ["late"]]


def test_with_concurrency_two_a_second_batch_runs_while_the_first_is_held(held):
    workers = RealWorkers(PROFILES.real, None, None, max_batch=8, concurrency=2)
    first = _ask(workers, "first")
    _wait_until(lambda: held.batches, "the first batch")
    second = _ask(workers, "second")  # the other batcher takes it: the first is still held
    assert second.result(10)[0] == "reply to second" and not first.done()
    held.release.set()
    assert first.result(10)[0] == "reply to first"
    assert held.batches == [["first"], ["second"]]
    with pytest.raises(ValueError, match="concurrency"):
        RealWorkers(PROFILES.real, None, None, concurrency=0)


def test_concurrent_batches_of_the_real_model_write_the_texts_each_writes_alone():
    """Two batchers share the one loaded model, each with an engine of its own; a row's text
    does not depend on the batch running beside it."""
    import dataclasses

    [real] = PROFILES.real
    workers = RealWorkers(
        [dataclasses.replace(real, dtype="float32")], None, 1, max_batch=2, concurrency=2
    )
    workers.start_loading()
    assert workers.ready.wait(120) and workers.error is None, workers.error
    assert len(workers.engines) == 2 and workers.engines[0] is not workers.engines[1]
    assert workers.engines[0].recent_replies.maxlen == REPLY_HISTORY  # float32: earlier replies
    chats = [[{"role": "user", "content": f"Name a colour and a number {i}."}] for i in range(4)]
    alone = [
        local_model.generate_chat(workers.model, workers.tokenizer, chat, 12, 0.7, i)[0]
        for i, chat in enumerate(chats)
    ]
    futures = [workers.submit(chat, 12, 0.7, i) for i, chat in enumerate(chats)]
    assert [f.result(120)[0] for f in futures] == alone
    assert sum(workers.batch_sizes) == 4


def test_a_bfloat16_real_worker_guesses_from_each_requests_own_tokens_only():
    """Its replies are scored and cached: in bfloat16 earlier replies would change them by
    rounding, so its engines keep none."""
    import dataclasses

    [real] = PROFILES.real
    workers = RealWorkers([dataclasses.replace(real, dtype="bfloat16")], None, 1)
    workers.start_loading()
    assert workers.ready.wait(120) and workers.error is None, workers.error
    assert workers.loaded_dtype == "bfloat16"
    assert workers.engines[0].recent_replies.maxlen == 0
    # the engine's one attention, as the Conductor's: packed passes, grouped heads
    assert supports_packed_rows(workers.model)


@pytest.fixture
def sandbox(held) -> Iterator[tuple[str, RealWorkers]]:
    app = create_app(PROFILES, [], latency_scale=0.0, load_real_model=False)
    real: RealWorkers = app.state.real_workers
    real.model, real.tokenizer = object(), object()  # the held generator never reads them
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _wait_until(lambda: server.started, "the server to start")
    yield f"http://127.0.0.1:{port}", real
    held.release.set()
    server.should_exit = True
    thread.join(10)


def test_a_caller_that_times_out_is_not_generated_for(sandbox, held):
    url, real = sandbox

    def post(text: str, timeout: float) -> httpx.Response:
        body = {"model": REAL, "messages": [{"role": "user", "content": text}]}
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=timeout)

    answered: list[httpx.Response] = []
    first = threading.Thread(target=lambda: answered.append(post("first", 30)))
    first.start()
    _wait_until(lambda: held.batches, "the first batch")
    with pytest.raises(httpx.ReadTimeout):
        post("given up", 0.5)  # queued behind the held batch; the caller leaves
    _wait_until(lambda: real._pending and real._pending[0][-1].cancelled(), "the cancel")
    held.release.set()
    first.join(30)
    assert answered[0].status_code == 200
    _wait_until(lambda: real.abandoned == 1, "the batcher to skip it")
    assert held.batches == [["first"]]
    health = httpx.get(f"{url}/health", timeout=10).json()
    assert health["real_model_abandoned"] == 1 and health["real_model_batches"] == 1


def test_a_slow_reply_is_logged_with_its_prompt_size(held, caplog):
    from conductor_pipeline.workers.sandbox import real_workers

    workers = RealWorkers(PROFILES.real, None, None, max_batch=8)
    assert workers.slow_batch_s == min(p.timeout_s for p in PROFILES.real)
    workers.slow_batch_s = 0.1  # the held first batch runs past it
    with caplog.at_level("WARNING", logger=real_workers.__name__):
        reply = _ask(workers, "one")
        _wait_until(lambda: held.batches, "the first batch")
        time.sleep(0.3)
        held.release.set()
        assert reply.result(10)[0] == "reply to one"
        _wait_until(lambda: "SmolLM2 reply" in caplog.text, "the slow-reply warning")
    assert "a SmolLM2 reply took 0 s in a batch of 1 rows (prompt tokens 3)" in caplog.text


def test_the_sandbox_server_dumps_its_threads_on_sigusr1(monkeypatch):
    import faulthandler
    import signal

    from conductor_pipeline.workers.sandbox import __main__ as sandbox_main

    registered = []
    monkeypatch.setattr(faulthandler, "register", lambda sig, **kw: registered.append((sig, kw)))
    monkeypatch.setattr(sandbox_main, "serve", lambda *a, **kw: None)
    sandbox_main.main(["--no-real-model"])
    assert registered == [(signal.SIGUSR1, {"all_threads": True})]


def test_a_batch_that_outlives_its_callers_dumps_every_threads_stack(held, capfd):
    workers = RealWorkers(PROFILES.real, None, None, max_batch=8)
    workers.slow_batch_s = 1.0  # the held first batch runs past it
    reply = _ask(workers, "stuck")
    _wait_until(lambda: held.batches, "the first batch")
    # another batcher in the process ends a batch meanwhile (in the sandbox server's tests,
    # an earlier test's): with faulthandler's one timer per process, its end cancelled ours
    other = RealWorkers(PROFILES.real, None, None, max_batch=8)
    assert _ask(other, "quick").result(10)[0] == "reply to quick"
    dumped: list[str] = []
    _wait_until(
        lambda: dumped.append(capfd.readouterr().err) or "in __call__" in "".join(dumped),
        "the stack dump",
    )
    held.release.set()
    assert reply.result(10)[0] == "reply to stuck"
    # the held generator's frame (where it is stuck), under the batcher's note
    assert "a SmolLM2 batch of 1 outlived its callers' timeout" in "".join(dumped)


def _entry(chars: int) -> tuple:
    return ([{"role": "user", "content": "x" * chars}], 8, 0.7, 0, Future())


def test_a_long_prompt_does_not_pad_a_whole_batch_to_its_length():
    """Rows are padded to the longest prompt: a 10,000-character aggregation prompt batched
    with seven short ones made a batch that outlived every caller's timeout, and their
    retries formed the same batch again. The oldest request always goes first; the others
    wait while they would push the padded prompt past max_batch_chars."""
    workers = RealWorkers(PROFILES.real, None, None, max_batch=8, max_batch_chars=24_000)
    long, *short = [_entry(10_000)] + [_entry(600) for _ in range(7)]
    workers._pending = [short[0], long, *short[1:]]

    def sizes(batch: list) -> list[int]:
        return [len(e[0][0]["content"]) for e in batch]

    # two rows padded to 10,000 characters fit; a third would not: the short ones wait
    assert sizes(workers._take(8, {})) == [600, 10_000]
    assert sizes(workers._take(8, {})) == [600] * 6 and workers._pending == []
    workers._pending = [_entry(50_000), _entry(10)]
    assert len(workers._take(8, {})) == 1  # an oversized request still runs, alone
    # joining a batch that writes a 10,000-character row: one short row fits beside it
    workers._pending = [_entry(600), _entry(600)]
    assert len(workers._take(8, {1: 10_000}, (8, 0.7))) == 1 and len(workers._pending) == 1
    cancelled = _entry(10)
    cancelled[-1].cancel()
    workers._pending = [cancelled, _entry(10)]
    assert len(workers._take(8, {})) == 1 and workers.abandoned == 1
    with pytest.raises(ValueError, match="max_batch_chars"):
        RealWorkers(PROFILES.real, None, None, max_batch_chars=0)


def test_the_batch_watchdog_reports_each_stall_once():
    from conductor_pipeline.workers.sandbox.real_workers import BatchWatchdog

    stalls: list[float] = []
    watchdog = BatchWatchdog(0.05, lambda: stalls.append(time.monotonic()))
    try:
        _wait_until(lambda: len(stalls) == 1, "the first stall")
        time.sleep(0.3)  # still no progress: the same stall, not reported again
        assert len(stalls) == 1
        watchdog.progress()
        _wait_until(lambda: len(stalls) == 2, "the stall after progress")
    finally:
        watchdog.stop()
