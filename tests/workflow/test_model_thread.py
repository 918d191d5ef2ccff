"""Local policies run all of their torch work on the process's torch thread.

OpenMP gives every thread that runs a parallel torch operation its own team of worker
threads; once a process holds more of them than it has cores, libgomp lets idle workers
sleep between operations, and each small operation pays to wake them (measured on 2 cores:
a served request 0.70 s instead of 0.50 s, a 16-row batch 2.6 s instead of 2.1 s). Asking
from several threads (the server's loader, its warm-up, each request through
``asyncio.to_thread``, several policies in one process) used to spread the work over as
many threads.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from conductor_pipeline.workers.torch_thread import run_on_torch_thread, set_torch_threads
from conductor_pipeline.workflow import LocalPolicy
from tests.local_batches import complete_batch

CONVERSATIONS = [
    [{"role": "user", "content": "Plan a workflow for: what is 2 + 2?"}],
    [{"role": "user", "content": "Plan a workflow for: is ice cold?"}],
]


def test_load_warm_up_and_every_generation_run_on_one_thread(tiny_model_dir):
    policy = LocalPolicy(model_dir=tiny_model_dir, torch_threads=2)
    ran_on: set[int] = set()
    drew_with: set[int] = set()

    # load from one thread, warm up from another, generate from event loops in a third; every
    # generation path (single, batch, continuous batch) runs the decoder stack on its own
    with ThreadPoolExecutor(1) as loader:
        loader.submit(policy.load).result()
    policy.model.get_decoder().register_forward_pre_hook(
        lambda *_: ran_on.add(threading.get_ident())
    )
    with ThreadPoolExecutor(1) as warmer:
        warmer.submit(policy.warm_up, CONVERSATIONS).result()

    async def generate() -> None:
        await policy.complete(CONVERSATIONS[0], temperature=1.0, max_tokens=6, seed=1)
        await complete_batch(policy, CONVERSATIONS, temperature=1.0, max_tokens=6, seeds=[2, 3])
        await policy.complete_continuously(
            [("a", CONVERSATIONS[0], 4), ("b", CONVERSATIONS[1], 5)],
            temperature=1.0,
            max_tokens=6,
            more=lambda writing: [],
            done=lambda handle, completion: None,
        )

    asyncio.run(generate())
    asyncio.run(generate())  # a new event loop has new default-executor threads
    # a second policy in the process, with its own thread count, uses the same thread
    other = LocalPolicy(model_dir=tiny_model_dir, torch_threads=3)
    other.load()
    other.model.get_decoder().register_forward_pre_hook(
        lambda *_: ran_on.add(threading.get_ident())
    )
    threads_seen: list[int] = []

    async def other_generates() -> None:
        await other.complete(CONVERSATIONS[1], temperature=1.0, max_tokens=4, seed=6)

    other.model.get_decoder().register_forward_pre_hook(
        lambda *_: threads_seen.append(torch.get_num_threads())
    )
    asyncio.run(other_generates())
    assert len(ran_on) == 1
    assert threading.get_ident() not in ran_on
    assert set(threads_seen) == {3}
    asyncio.run(generate())  # the first policy gets its own thread count back

    # the rows' draw threads run torch single-threaded: no OpenMP team of their own
    assert run_on_torch_thread(torch.get_num_threads) == 2

    pool = policy._draw_threads()
    assert pool is not None
    drew_with.update(pool.map(lambda _: torch.get_num_threads(), range(4)))
    assert drew_with == {1}


def test_draw_threads_keep_one_torch_thread_when_the_torch_thread_sets_two(tiny_model_dir):
    # torch sets a thread's count at its first parallel operation, to the count last set
    # in the process: the draw threads start (set to one), the torch thread then sets two,
    # and only then do the draw threads run a parallel operation
    policy = LocalPolicy(model_dir=tiny_model_dir, torch_threads=2)
    policy.load()  # the draw threads belong to the loaded model's engine
    pool = policy._draw_threads()
    assert pool is not None
    started, release = threading.Barrier(3), threading.Event()

    def first_parallel_operation() -> int:
        started.wait()
        release.wait()
        torch.ones(1_000_000).div(0.7)  # large enough for torch to split it over threads
        return torch.get_num_threads()

    futures = [pool.submit(first_parallel_operation) for _ in range(2)]
    started.wait()
    run_on_torch_thread(set_torch_threads, 2)  # what the policy sets before each generation
    release.set()
    assert [f.result() for f in futures] == [1, 1]


def test_an_error_on_the_model_thread_reaches_the_caller(tiny_model_dir):
    policy = LocalPolicy(model_dir=tiny_model_dir / "missing")
    try:
        policy.load()
    except Exception as exc:  # the loader's own error, not a wrapper
        assert "missing" in str(exc)
    else:  # pragma: no cover - the folder does not exist
        raise AssertionError("loading a missing model folder succeeded")
