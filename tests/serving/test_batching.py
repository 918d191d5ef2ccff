"""Micro-batching of Conductor generation in the API (issue 15, section 4).

Around a fake policy: grouping by sampling settings, the collection window, the batch size
cap, error isolation and cancellation. With the real SmolLM2 policy: concurrent requests are
generated in fewer batched calls and write the texts they write one at a time."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import httpx
import pytest

from conductor_pipeline.serving.batching import (
    BatchGenerationError,
    BatchingSettings,
    MicroBatchingPolicy,
    batched_policy,
)
from conductor_pipeline.serving.server import BackgroundServer, in_process_policy
from conductor_pipeline.serving.settings import ServingSettings, serving_settings
from conductor_pipeline.workflow.policy import LocalPolicy, PolicyCompletion, ScriptedPolicy

from .test_app import KEY, ask, make_service, post


class FakePolicy:
    """Echoes each prompt and seed in a batch that admits rows between passes; records every
    batch (its first rows' seeds and settings) and how many rows were writing whenever rows
    joined. A row needs ``passes`` passes (a prompt ``long`` waits for ``release``
    instead); ``hold`` keeps the batch from its first pass until set; a prompt ``boom``
    fails the batch."""

    name = "fake"

    def __init__(self, passes: int = 1) -> None:
        self.calls: list[tuple[list[int], float, int]] = []
        self.hold: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.loaded = False
        self.passes = passes
        self.joins: list[tuple[int, int]] = []  # (rows writing, rows joining)
        self.ended = 0  # batches whose call has returned
        self.release = threading.Event()
        self.release.set()

    def load(self) -> None:
        self.loaded = True

    @staticmethod
    def _reply(messages: list[dict[str, str]], seed: int) -> PolicyCompletion:
        return PolicyCompletion(f"{messages[-1]['content']}#{seed}", 1, 1, 0.0)

    async def complete(self, messages, *, temperature, max_tokens, seed):  # noqa: ANN001, ANN201
        raise AssertionError("the batcher answers every request in a batch")

    async def complete_continuously(self, first, *, temperature, max_tokens, more, done):  # noqa: ANN001, ANN201
        self.calls.append(([s for _, _, s in first], temperature, max_tokens))
        self.started.set()
        if self.hold is not None:
            await self.hold.wait()
        await asyncio.to_thread(self._run, list(first), more, done)
        self.ended += 1

    def _run(self, joining, more, done) -> None:  # noqa: ANN001
        import time

        live: list[list] = []
        while joining or live:
            live += [[handle, messages, seed, 0] for handle, messages, seed in joining]
            time.sleep(0.01)  # a pass
            for row in list(live):
                handle, messages, seed, passes = row
                text = messages[-1]["content"]
                if text == "boom":
                    raise RuntimeError("the model ran out of memory")
                row[3] = passes = passes + 1
                if (text == "long" and self.release.is_set()) or (
                    text != "long" and passes >= self.passes
                ):
                    live.remove(row)
                    done(handle, self._reply(messages, seed))
            joining = more(len(live))
            if joining:
                self.joins.append((len(live), len(joining)))


def _msgs(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _ask(policy, text: str, seed: int, temperature: float = 0.7, max_tokens: int = 16):  # noqa: ANN001, ANN202
    return policy.complete(_msgs(text), temperature=temperature, max_tokens=max_tokens, seed=seed)


def test_requests_waiting_together_share_one_batch_and_get_their_own_rows():
    fake = FakePolicy()
    policy = MicroBatchingPolicy(fake, BatchingSettings(max_batch=16, max_wait_ms=0))

    async def go():
        return await asyncio.gather(*(_ask(policy, f"q{i}", seed=100 + i) for i in range(5)))

    out = asyncio.run(go())
    assert [c.text for c in out] == [f"q{i}#{100 + i}" for i in range(5)]
    assert fake.calls == [([100, 101, 102, 103, 104], 0.7, 16)]
    assert policy.stats.sizes == {5: 1} and policy.stats.rows == 5


def test_different_sampling_settings_are_generated_in_separate_batches():
    fake = FakePolicy()
    policy = MicroBatchingPolicy(fake, BatchingSettings(max_wait_ms=0))

    async def go():
        return await asyncio.gather(
            _ask(policy, "a", 1, temperature=0.7),
            _ask(policy, "b", 2, temperature=0.0),
            _ask(policy, "c", 3, temperature=0.7),
            _ask(policy, "d", 4, temperature=0.7, max_tokens=64),
            _ask(policy, "e", 5, temperature=0.0),
        )

    out = asyncio.run(go())
    assert [c.text for c in out] == ["a#1", "b#2", "c#3", "d#4", "e#5"]
    # oldest group first
    assert fake.calls == [([1, 3], 0.7, 16), ([2, 5], 0.0, 16), ([4], 0.7, 64)]


def test_a_lone_request_is_answered_when_the_window_closes():
    fake = FakePolicy()
    policy = MicroBatchingPolicy(fake, BatchingSettings(max_batch=16, max_wait_ms=30))
    out = asyncio.run(_ask(policy, "alone", 9))
    assert out.text == "alone#9" and fake.calls == [([9], 0.7, 16)]


def test_a_full_batch_does_not_wait_for_the_window():
    """A window of 10 minutes: the test would hang if a full batch waited for it."""
    fake = FakePolicy()
    policy = MicroBatchingPolicy(fake, BatchingSettings(max_batch=2, max_wait_ms=10_000))

    async def go():
        return await asyncio.wait_for(
            asyncio.gather(_ask(policy, "x", 1), _ask(policy, "y", 2)), timeout=60
        )

    assert [c.text for c in asyncio.run(go())] == ["x#1", "y#2"]


def test_requests_with_other_settings_arriving_during_a_batch_form_the_next_one():
    fake = FakePolicy()
    policy = MicroBatchingPolicy(fake, BatchingSettings(max_batch=16, max_wait_ms=0))

    async def go():
        fake.hold = asyncio.Event()
        first = [asyncio.create_task(_ask(policy, f"a{i}", i)) for i in range(2)]
        await fake.started.wait()  # the first batch is generating
        later = [asyncio.create_task(_ask(policy, f"b{i}", 10 + i, 0.0)) for i in range(3)]
        await asyncio.sleep(0)
        assert policy.waiting == 3
        fake.hold.set()
        return await asyncio.gather(*first, *later)

    out = asyncio.run(go())
    assert [c.text for c in out] == ["a0#0", "a1#1", "b0#10", "b1#11", "b2#12"]
    assert fake.calls == [([0, 1], 0.7, 16), ([10, 11, 12], 0.0, 16)]
    assert policy.stats.joined == 0


def test_a_failed_batch_fails_only_its_own_requests():
    fake = FakePolicy()
    policy = MicroBatchingPolicy(fake, BatchingSettings(max_wait_ms=0))

    async def go():
        return await asyncio.gather(
            _ask(policy, "boom", 1, temperature=0.0),
            _ask(policy, "fine", 2, temperature=0.0),
            _ask(policy, "other", 3, temperature=1.0),
            _ask(policy, "group", 4, temperature=1.0),
            return_exceptions=True,
        )

    failed_a, failed_b, ok_a, ok_b = asyncio.run(go())
    for error in (failed_a, failed_b):
        assert isinstance(error, BatchGenerationError)
        assert "batch of 2" in str(error) and "out of memory" in str(error)
        assert isinstance(error.__cause__, RuntimeError)
    assert (ok_a.text, ok_b.text) == ("other#3", "group#4")

    async def after():  # the batcher keeps serving
        return await asyncio.gather(_ask(policy, "again", 5), _ask(policy, "more", 6))

    assert [c.text for c in asyncio.run(after())] == ["again#5", "more#6"]


def test_a_row_the_batch_never_answered_is_an_error_not_a_wait_forever():
    fake = FakePolicy()

    async def answers_one(first, *, temperature, max_tokens, more, done):  # noqa: ANN001, ANN202
        handle, messages, seed = first[0]
        done(handle, fake._reply(messages, seed))

    fake.complete_continuously = answers_one
    policy = MicroBatchingPolicy(fake, BatchingSettings(max_wait_ms=0))

    async def go():
        return await asyncio.wait_for(
            asyncio.gather(_ask(policy, "a", 1), _ask(policy, "b", 2), return_exceptions=True),
            timeout=30,
        )

    answered, error = asyncio.run(go())
    assert answered.text == "a#1"
    assert isinstance(error, BatchGenerationError) and "without a reply" in str(error)


def test_a_cancelled_request_leaves_its_batch_alone():
    fake = FakePolicy()
    policy = MicroBatchingPolicy(fake, BatchingSettings(max_batch=16, max_wait_ms=0))

    async def go():
        fake.hold = asyncio.Event()
        running = [asyncio.create_task(_ask(policy, f"r{i}", i)) for i in range(3)]
        await fake.started.wait()
        running[1].cancel()  # its row is generating: the result is dropped
        queued = [asyncio.create_task(_ask(policy, f"q{i}", 10 + i)) for i in range(3)]
        await asyncio.sleep(0)
        queued[0].cancel()  # still queued: it never reaches the model
        await asyncio.sleep(0)
        fake.hold.set()
        return await asyncio.gather(*running, *queued, return_exceptions=True)

    out = asyncio.run(go())
    assert isinstance(out[1], asyncio.CancelledError) and isinstance(out[3], asyncio.CancelledError)
    assert [out[i].text for i in (0, 2, 4, 5)] == ["r0#0", "r2#2", "q1#11", "q2#12"]
    # the two still queued joined the running batch; the cancelled one never did
    assert fake.calls == [([0, 1, 2], 0.7, 16)] and policy.stats.joined == 2


def test_the_batcher_starts_afresh_on_a_new_event_loop():
    fake = FakePolicy()
    policy = MicroBatchingPolicy(fake, BatchingSettings(max_wait_ms=0))
    for seed in (1, 2):
        assert asyncio.run(_ask(policy, "x", seed)).text == f"x#{seed}"


def test_settings_validation_names_the_key():
    assert serving_settings({}).batching == BatchingSettings()
    assert ServingSettings().max_concurrency >= BatchingSettings().max_batch
    custom = serving_settings({"batching": {"max_batch": 4, "max_wait_ms": 5, "enabled": False}})
    assert custom.batching == BatchingSettings(enabled=False, max_batch=4, max_wait_ms=5)
    for bad, key in [
        ({"max_batch": 0}, "max_batch"),
        ({"max_batch": 2.5}, "max_batch"),
        ({"max_wait_ms": -1}, "max_wait_ms"),
        ({"max_wait_ms": "soon"}, "max_wait_ms"),
        ({"enabled": "yes"}, "enabled"),
        ({"window": 3}, "unknown"),
    ]:
        with pytest.raises(ValueError, match=key):
            serving_settings({"batching": bad})
    with pytest.raises(ValueError, match="serving.batching"):
        serving_settings({"batching": [1]})


def test_only_a_policy_that_batches_is_wrapped_and_it_passes_load_through():
    settings = BatchingSettings()
    scripted = ScriptedPolicy()
    assert batched_policy(scripted, settings) is scripted
    fake = FakePolicy()
    assert batched_policy(fake, BatchingSettings(enabled=False)) is fake
    wrapped = batched_policy(fake, settings)
    assert isinstance(wrapped, MicroBatchingPolicy) and wrapped.name == "fake"
    wrapped.load()
    assert fake.loaded and wrapped.warm_up is None
    with pytest.raises(ValueError, match="complete_continuously"):
        MicroBatchingPolicy(scripted)
    # what `conductor serve` builds from conductor.policy (nothing is loaded here)
    local = in_process_policy({"kind": "local"}, None, ServingSettings())
    assert isinstance(local, MicroBatchingPolicy) and isinstance(local.policy, LocalPolicy)
    assert local.warm_up == local.policy.warm_up
    off = ServingSettings(batching=BatchingSettings(enabled=False))
    assert isinstance(in_process_policy({"kind": "local"}, None, off), LocalPolicy)
    assert isinstance(
        in_process_policy({"kind": "scripted"}, None, ServingSettings()), ScriptedPolicy
    )


class ScriptedBatches(ScriptedPolicy):
    """The scripted rule in continuous batches; counts the rows of each pass."""

    def __init__(self) -> None:
        super().__init__(worker=1)
        self.batches: list[int] = []
        self.lock = threading.Lock()

    async def complete_continuously(self, first, *, temperature, max_tokens, more, done):  # noqa: ANN001, ANN201
        joining = list(first)
        while joining:
            with self.lock:
                self.batches.append(len(joining))
            await asyncio.sleep(0.05)  # a generation long enough for others to queue behind it
            for handle, messages, seed in joining:
                reply = await self.complete(
                    messages, temperature=temperature, max_tokens=max_tokens, seed=seed
                )
                done(handle, reply)
            joining = more(0)


def test_concurrent_api_requests_share_batches():
    inner = ScriptedBatches()
    # a long window: the requests batch however slowly this machine sends them
    policy = MicroBatchingPolicy(inner, BatchingSettings(max_batch=6, max_wait_ms=1000))
    with BackgroundServer(make_service(policy, max_concurrency=16)) as server:
        server.wait_ready()

        async def go():
            async with httpx.AsyncClient(timeout=60) as client:
                headers = {"Authorization": f"Bearer {KEY}"}
                return await asyncio.gather(
                    *(
                        client.post(
                            f"{server.base_url}/chat/completions",
                            json=ask(f"What is {i} + {i}?", seed=i),
                            headers=headers,
                        )
                        for i in range(12)
                    )
                )

        responses = asyncio.run(go())
        assert post(server, ask()).status_code == 200
    assert [r.status_code for r in responses] == [200] * 12
    for i, response in enumerate(responses):
        steps = response.json()["conductor"]["steps"]
        assert steps[0]["subtask"] == f"What is {i} + {i}?"  # each got its own workflow
    assert sum(inner.batches) == policy.stats.rows == 13
    assert policy.stats.batches < 12  # fewer generate calls than requests


# --- the real policy ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2() -> LocalPolicy:
    policy = LocalPolicy(torch_threads=1)
    policy.load()
    return policy


def test_real_policy_concurrent_requests_write_their_sequential_texts(smollm2):
    from conductor_pipeline.workflow.orchestrator import sample_seed
    from conductor_pipeline.workflow.prompts import PromptConfig, conductor_messages

    def planning(question: str) -> list[dict[str, str]]:
        return conductor_messages(question, ["a", "b", "c"], PromptConfig(few_shot=[]))

    questions = [
        "Compute the sum of 1234 and 4321.",
        "Are all cats mammals? Yes or No.",
        "Write a Python function that reverses a string.",
        "What is the capital of France?",
        "Compute the sum of 1234 and 4321.",  # the same question, another seed
    ]
    seeds = [sample_seed(0, q, 0, i // 4) for i, q in enumerate(questions)]
    smollm2.warm_up([planning("What is 2 + 2?"), planning("Is ice cold?")])
    sequential = [
        asyncio.run(smollm2.complete(planning(q), temperature=0.7, max_tokens=20, seed=s))
        for q, s in zip(questions, seeds, strict=True)
    ]
    policy = MicroBatchingPolicy(smollm2, BatchingSettings(max_batch=16, max_wait_ms=0))
    ticks = 0

    async def heartbeat(done: asyncio.Event) -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    async def go():
        done = asyncio.Event()
        beat = asyncio.create_task(heartbeat(done))
        out = await asyncio.gather(
            *(
                policy.complete(planning(q), temperature=0.7, max_tokens=20, seed=s)
                for q, s in zip(questions, seeds, strict=True)
            )
        )
        done.set()
        await beat
        return out

    concurrent = asyncio.run(go())
    assert [c.text for c in concurrent] == [c.text for c in sequential]
    assert [c.completion_tokens for c in concurrent] == [c.completion_tokens for c in sequential]
    assert [c.prompt_tokens for c in concurrent] == [c.prompt_tokens for c in sequential]
    assert policy.stats.sizes == {5: 1}  # five requests, one batched generate call
    assert ticks >= 5  # the event loop kept running while the batch generated


def test_real_policy_uses_grouped_attention_with_the_same_logits(smollm2, monkeypatch):
    import torch
    import transformers.integrations.sdpa_attention as sdpa

    from conductor_pipeline.generation.attention import GROUPED_ATTENTION

    model = smollm2.model
    assert model.config._attn_implementation == GROUPED_ATTENTION
    ids = torch.tensor([[2, 2, 2, 504, 3493, 28], [1, 9690, 504, 3493, 28, 1004]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.inference_mode():
        model.set_attn_implementation("sdpa")
        try:
            stock = model(input_ids=ids, attention_mask=mask).logits
        finally:
            model.set_attn_implementation(GROUPED_ATTENTION)

        def no_copy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            raise AssertionError("keys and values were copied per query head")

        monkeypatch.setattr(sdpa, "repeat_kv", no_copy)
        grouped = model(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(grouped[mask.bool()], stock[mask.bool()], atol=1e-4)


def test_real_policy_rows_leave_the_batch_when_they_end(smollm2, monkeypatch):
    """A batch computes each row only until its end token: the rows fed to decode steps add
    up to the tokens each row still had to write, not rows x the longest row."""
    conversations = [
        _msgs("Answer with one word: is the sky blue?"),
        _msgs("Write a long story about a dragon who learns to bake bread."),
        _msgs("Say OK."),
    ]
    seeds = [1, 2, 3]
    # one token a pass (guesses would cover several: tests/generation/test_decode.py)
    monkeypatch.setattr(smollm2, "lookup_tokens", 0)
    single = [
        asyncio.run(smollm2.complete(c, temperature=0.0, max_tokens=24, seed=s))
        for c, s in zip(conversations, seeds, strict=True)
    ]
    lengths = [c.completion_tokens for c in single]
    assert len(set(lengths)) > 1  # the prompts end at different lengths
    fed = []  # every pass through the layers: the prefill's, then the decoding ones
    hook = smollm2.model.get_decoder().register_forward_pre_hook(
        lambda _, args, kwargs: fed.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    batch: dict[int, PolicyCompletion] = {}
    try:
        asyncio.run(
            smollm2.complete_continuously(
                [(i, c, s) for i, (c, s) in enumerate(zip(conversations, seeds, strict=True))],
                temperature=0.0,
                max_tokens=24,
                more=lambda _: [],
                done=batch.__setitem__,
            )
        )
    finally:
        hook.remove()
    batch = [batch[i] for i in range(len(conversations))]
    assert [c.text for c in batch] == [c.text for c in single]
    assert [c.completion_tokens for c in batch] == lengths
    # after the prefill: one token a pass for each row still writing (packed: no pads)
    decode_rows = sum(shape.numel() for shape in fed[1:])
    assert decode_rows == sum(n - 1 for n in lengths) < len(lengths) * (max(lengths) - 1)


def test_the_concurrency_benchmark_reports_each_client_count():
    """`make bench ARGS=serving`'s concurrency case, over the scripted policy with batching
    and a fake pool (the real Conductor's figures come from `make bench`, not tests)."""
    from conductor_pipeline.benchmarks.serving_concurrency import measure_client_loads

    from .test_app import FakePool

    class LoggingPool(FakePool):  # keeps a usage log, as the worker pool does
        def __init__(self) -> None:
            super().__init__()
            self.usage_log: list[SimpleNamespace] = []

        async def __call__(self, worker, messages, sample_index=0):
            reply = await super().__call__(worker, messages, sample_index)
            self.usage_log.append(SimpleNamespace(worker=reply.worker))
            return reply

    service = make_service()
    pool = LoggingPool()
    pool.descriptions, pool.names = service.descriptions, service.worker_names
    policy = MicroBatchingPolicy(ScriptedBatches(), BatchingSettings(max_wait_ms=0))
    figures = measure_client_loads(
        policy, pool, service.orchestration, service.served, ServingSettings(),
        clients=(1, 4), requests_per_client=2, single_requests=3,
    )  # fmt: skip
    one, four = figures["clients_1"], figures["clients_4"]
    assert (one["requests"], four["requests"]) == (3, 8)
    assert one["status_counts"] == {"200": 3} and four["status_counts"] == {"200": 8}
    assert one["batch_sizes"] == {"1": 3}  # one client never shares a batch
    assert sum(int(n) * c for n, c in four["batch_sizes"].items()) + four["joined_rows"] == 8
    for case in (one, four):
        assert case["throughput_rps"] > 0 and 0 < case["latency_p50_s"] <= case["latency_p95_s"]
        assert case["first_round_s"] > 0  # the unmeasured first round, reported apart
    # one step a request; the unmeasured first round's calls are not counted
    assert one["worker_calls"] == {"w1": 3} and four["worker_calls"] == {"w1": 8}
    assert figures["ready_s"] > 0


async def _opens_at_once(policy: MicroBatchingPolicy, fake: FakePolicy, *seeds: int) -> bool:
    """Whether requests with these seeds start a batch within a few turns of the loop (their
    window is far longer). Either way they are done with on return: answered, and their
    batch ended (the next requests must not join it), or cancelled while they waited."""
    calls = len(fake.calls)
    asked = [asyncio.create_task(_ask(policy, f"q{seed}", seed)) for seed in seeds]
    for _ in range(10):
        await asyncio.sleep(0)
    if len(fake.calls) == calls:
        for task in asked:
            task.cancel()
        await asyncio.gather(*asked, return_exceptions=True)
        return False
    await asyncio.gather(*asked)
    while fake.ended < len(fake.calls):
        await asyncio.sleep(0.001)
    return True


def test_the_window_is_skipped_only_for_a_lone_request():
    fake = FakePolicy()
    policy = MicroBatchingPolicy(fake, BatchingSettings(max_wait_ms=10_000))
    in_flight = [2]

    async def go() -> None:
        # no count of requests in flight: the window runs
        assert not await _opens_at_once(policy, fake, 1)
        policy.in_flight = lambda: in_flight[0]
        assert not await _opens_at_once(policy, fake, 2)  # another request is on its way
        in_flight[0] = 1
        assert await _opens_at_once(policy, fake, 3)  # its batch starts at once
        in_flight[0] = 3
        assert await _opens_at_once(policy, fake, 4, 5, 6)  # every request in flight waits
        in_flight[0] = 1
        # right after a batch of several, their clients come back
        assert not await _opens_at_once(policy, fake, 7)

    asyncio.run(go())
    assert fake.calls == [([3], 0.7, 16), ([4, 5, 6], 0.7, 16)]


def test_the_server_tells_the_batcher_how_many_requests_are_in_flight():
    policy = MicroBatchingPolicy(ScriptedBatches(), BatchingSettings(max_wait_ms=0))
    with BackgroundServer(make_service(policy)) as server:
        server.wait_ready()
        assert policy.in_flight is not None and policy.in_flight() == 0
        server.app.state.gate.try_enter()
        assert policy.in_flight() == 1
        server.app.state.gate.leave()
        assert post(server, ask()).status_code == 200


def test_after_a_batch_of_several_the_window_waits_for_their_clients():
    """A request that comes after a batch of several rows has ended does not start the next
    batch alone: the window counts from that batch's end, however long it waited before."""
    fake = FakePolicy()
    policy = MicroBatchingPolicy(fake, BatchingSettings(max_batch=3, max_wait_ms=10_000))

    async def turns(n: int = 10) -> None:
        for _ in range(n):
            await asyncio.sleep(0)

    async def go():
        await asyncio.gather(*(_ask(policy, f"a{i}", i) for i in range(3)))  # full
        # its rows are answered before its generation thread returns: a request queued in
        # between would join the batch still running (on a busy machine it did)
        while fake.ended < 1:
            await asyncio.sleep(0.001)
        late = asyncio.create_task(_ask(policy, "b0", 10))
        await turns()
        policy._queue[0].arrived -= 3600  # as if it had waited an hour
        policy._wake.set()  # the batcher looks again: the hour does not count
        await turns()
        assert not late.done() and len(fake.calls) == 1  # waits for the others to return
        more = [asyncio.create_task(_ask(policy, f"b{i}", 10 + i)) for i in (1, 2)]
        return await asyncio.gather(late, *more)

    out = asyncio.run(go())
    assert [c.text for c in out] == ["b0#10", "b1#11", "b2#12"]
    assert fake.calls == [([0, 1, 2], 0.7, 16), ([10, 11, 12], 0.7, 16)]


# --- continuous batching: requests join a batch that is generating -------------------------


def _held_batcher(passes: int) -> tuple[FakePolicy, MicroBatchingPolicy]:
    """A batcher whose ``long`` rows write until the fake's ``release`` is set."""
    fake = FakePolicy(passes=passes)
    fake.release.clear()
    return fake, MicroBatchingPolicy(fake, BatchingSettings(max_batch=16, max_wait_ms=0))


def test_requests_arriving_during_a_continuous_batch_join_it_and_leave_when_done():
    fake, policy = _held_batcher(passes=3)

    async def go():
        long = asyncio.create_task(_ask(policy, "long", 1))
        first = asyncio.create_task(_ask(policy, "a", 2))
        await fake.started.wait()
        later = [asyncio.create_task(_ask(policy, f"b{i}", 10 + i)) for i in range(3)]
        # the three joined the running batch and were answered while "long" still writes
        done, _ = await asyncio.wait([first, *later], timeout=30)
        assert len(done) == 4 and not long.done()
        fake.release.set()
        return await asyncio.gather(long, first, *later)

    out = asyncio.run(go())
    assert [c.text for c in out] == ["long#1", "a#2", "b0#10", "b1#11", "b2#12"]
    assert fake.calls == [([1, 2], 0.7, 16)]  # one batch for all five
    assert policy.stats.sizes == {2: 1} and policy.stats.joined == 3 and policy.stats.rows == 5
    assert all(writing >= 1 for writing, _ in fake.joins)  # they joined rows still writing


def test_a_continuous_batch_never_holds_more_than_max_batch_rows():
    fake = FakePolicy(passes=2)
    policy = MicroBatchingPolicy(fake, BatchingSettings(max_batch=3, max_wait_ms=0))

    async def go():
        return await asyncio.gather(*(_ask(policy, f"q{i}", seed=i) for i in range(10)))

    out = asyncio.run(go())
    assert [c.text for c in out] == [f"q{i}#{i}" for i in range(10)]
    assert fake.calls == [([0, 1, 2], 0.7, 16)]  # the rest joined as rows left
    assert all(writing + joining <= 3 for writing, joining in fake.joins)
    assert policy.stats.rows == 10 and policy.stats.joined == 7


def test_a_failed_continuous_batch_fails_its_waiting_requests_and_keeps_the_answered_ones():
    fake, policy = _held_batcher(passes=1)

    async def go():
        long = asyncio.create_task(_ask(policy, "long", 1))
        quick = asyncio.create_task(_ask(policy, "quick", 2))
        answered = await quick
        boom = asyncio.create_task(_ask(policy, "boom", 3))  # joins, then fails the batch
        results = await asyncio.gather(long, boom, return_exceptions=True)
        return answered, results

    answered, (long, boom) = asyncio.run(go())
    assert answered.text == "quick#2"
    for error in (long, boom):
        assert isinstance(error, BatchGenerationError)
        assert "batch of 3" in str(error) and "out of memory" in str(error)
    # the batcher keeps serving
    fake.release.set()
    assert asyncio.run(_ask(policy, "again", 4)).text == "again#4"


# compact: the writing rows' cache is compacted at every join (else only once it has piled
# up hidden columns)
@pytest.mark.parametrize("compact", [False, True])
def test_real_policy_rows_that_join_a_running_batch_write_their_sequential_texts(
    smollm2, monkeypatch, compact
):
    """Two planning prompts start; after two passes a third joins (its opening from the
    kept cache), after three a prompt without that opening; every reply is the one the
    policy writes alone."""
    from conductor_pipeline.generation import decode
    from conductor_pipeline.workflow.prompts import PromptConfig, conductor_messages

    if compact:
        monkeypatch.setattr(decode, "_MAX_HIDDEN", 0)

    def planning(question: str) -> list[dict[str, str]]:
        return conductor_messages(question, ["a", "b", "c"], PromptConfig(few_shot=[]))

    conversations = [
        planning("Compute the sum of 1234 and 4321."),
        planning("Are all cats mammals? Yes or No."),
        planning("Write a Python function that reverses a string and explains each step."),
        [{"role": "user", "content": "Count from one to twelve in words, separated by commas."}],
    ]
    seeds = [3, 5, 7, 11]
    smollm2.warm_up([planning("What is 2 + 2?"), planning("Is ice cold?")])
    alone = [
        asyncio.run(smollm2.complete(c, temperature=0.7, max_tokens=40, seed=s))
        for c, s in zip(conversations, seeds, strict=True)
    ]
    asked: list[int] = []
    answers: dict[int, PolicyCompletion] = {}
    prompt_passes: list[int] = []  # rows of each pass over prompts

    def counted(_, args, kwargs) -> None:  # noqa: ANN001
        if kwargs["attention_mask"].dim() == 2:  # decoding passes bring a 4-d mask
            prompt_passes.append(kwargs["input_ids"].shape[0])

    hook = smollm2.model.get_decoder().register_forward_pre_hook(counted, with_kwargs=True)

    def more(writing: int) -> list:
        asked.append(writing)
        joining = {2: [2], 3: [3]}.get(len(asked), [])
        if joining:
            assert writing >= 2  # the first rows are still writing
        return [(i, conversations[i], seeds[i]) for i in joining]

    def done(handle: int, completion: PolicyCompletion) -> None:
        answers[handle] = completion

    first = [(i, conversations[i], seeds[i]) for i in (0, 1)]
    try:
        asyncio.run(
            smollm2.complete_continuously(
                first, temperature=0.7, max_tokens=40, more=more, done=done
            )
        )
    finally:
        hook.remove()
    assert sorted(answers) == [0, 1, 2, 3]
    assert [answers[i].text for i in range(4)] == [c.text for c in alone]
    assert [answers[i].completion_tokens for i in range(4)] == [c.completion_tokens for c in alone]
    assert [answers[i].prompt_tokens for i in range(4)] == [c.prompt_tokens for c in alone]
    assert prompt_passes == [2, 1, 1]  # one pass over the prompts of each joining group


def test_a_cancelled_continuous_batch_cancels_its_requests_and_admits_no_one_more():
    """The batcher's task is cancelled (the server's loop shuts down) while a continuous
    batch generates: the requests it has taken, joined ones included, are cancelled rather
    than left waiting, and the generation thread admits nobody after that."""
    fake, policy = _held_batcher(passes=3)

    async def go():
        long = asyncio.create_task(_ask(policy, "long", 1))
        other = asyncio.create_task(_ask(policy, "long", 2))
        await fake.started.wait()
        joined = asyncio.create_task(_ask(policy, "long", 3))
        while policy.stats.joined < 1:
            await asyncio.sleep(0.01)
        # the batcher's task, as the loop's shutdown cancels it (named by the batcher)
        next(t for t in asyncio.all_tasks() if t.get_name() == "conductor-batcher").cancel()
        gathered = asyncio.gather(long, other, joined, return_exceptions=True)
        try:
            out = await asyncio.wait_for(gathered, timeout=30)  # not left waiting forever
        finally:
            fake.release.set()  # the generation thread finishes its rows either way
        late = asyncio.create_task(_ask(policy, "late", 4))  # a new drainer serves it
        return out, await late

    out, late = asyncio.run(go())
    assert all(isinstance(r, asyncio.CancelledError) for r in out)
    assert late.text == "late#4"
    assert fake.calls[0][0] == [1, 2] and policy.stats.joined == 1


def test_a_bfloat16_policy_runs_in_bfloat16_and_batches_requests():
    """``serving.dtype: bfloat16`` (or ``auto`` on a CPU with AMX): the weights are bfloat16
    and concurrent requests share one batch. A batched text may differ from the request's
    text alone: bfloat16 rounds a padded batch's sums more coarsely (docs/serving.md, "Precision")."""
    import torch

    from conductor_pipeline.workflow.prompts import PromptConfig, conductor_messages

    # one token a pass: no guess from the first reply changes how the second is summed
    policy = LocalPolicy(torch_threads=1, dtype="bfloat16", lookup_tokens=0)
    policy.load()
    assert policy.loaded_dtype == "bfloat16"
    assert {p.dtype for p in policy.model.parameters()} == {torch.bfloat16}
    questions = ["Compute the sum of 1234 and 4321.", "What is the capital of France?"]
    chats = [conductor_messages(q, ["a", "b", "c"], PromptConfig(few_shot=[])) for q in questions]
    alone = asyncio.run(policy.complete(chats[0], temperature=0.7, max_tokens=12, seed=3))
    again = asyncio.run(policy.complete(chats[0], temperature=0.7, max_tokens=12, seed=3))
    assert alone.text == again.text and alone.completion_tokens > 0  # a seed still decides
    batcher = MicroBatchingPolicy(policy, BatchingSettings(max_batch=16, max_wait_ms=0))

    async def go():
        return await asyncio.gather(
            *(batcher.complete(c, temperature=0.7, max_tokens=12, seed=3) for c in chats)
        )

    batched = asyncio.run(go())
    assert batcher.stats.sizes == {2: 1}
    assert batched[0].prompt_tokens == alone.prompt_tokens
    assert all(b.completion_tokens > 0 for b in batched)


def test_the_queue_rule_opens_with_the_oldest_and_joins_only_ahead_of_other_settings():
    from conductor_pipeline.generation.batching import take_queued

    def key(request: str) -> str:
        return request[0]  # "a1": settings "a"

    queue = ["a1", "b1", "a2", "a3"]
    assert take_queued(queue, 8, key) == ["a1", "a2", "a3"] and queue == ["b1"]
    queue = ["a1", "b1", "a2"]  # joining an "a" batch: none behind "b1", which opens the next
    assert take_queued(queue, 8, key, joining="a") == ["a1"] and queue == ["b1", "a2"]
    queue = ["a1", "a2", "a3"]
    assert take_queued(queue, 2, key) == ["a1", "a2"] and queue == ["a3"]  # room
    verdicts = {"a1": None, "a2": False, "a3": True}  # dropped, waits, taken
    queue = ["a1", "a2", "a3"]
    assert take_queued(queue, 8, key, admit=verdicts.get) == ["a3"] and queue == ["a2"]


def test_a_running_batch_admits_no_joiner_queued_behind_a_request_with_other_settings():
    fake, policy = _held_batcher(passes=3)

    async def go():
        long = asyncio.create_task(_ask(policy, "long", 1))
        await fake.started.wait()
        other = asyncio.create_task(_ask(policy, "other", 2, temperature=0.0))
        await asyncio.sleep(0)
        behind = asyncio.create_task(_ask(policy, "behind", 3))  # the running batch's settings
        await asyncio.sleep(0.2)  # passes go by: it must not join
        assert policy.stats.joined == 0
        fake.release.set()
        return await asyncio.gather(long, other, behind)

    out = asyncio.run(go())
    assert [c.text for c in out] == ["long#1", "other#2", "behind#3"]
    assert fake.calls == [([1], 0.7, 16), ([2], 0.0, 16), ([3], 0.7, 16)]
