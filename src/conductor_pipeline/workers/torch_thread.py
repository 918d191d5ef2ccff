"""The one thread of the process that runs local model work (the Conductor's
:class:`~conductor_pipeline.workflow.policy.LocalPolicy`: loading, warm-up, generation).

OpenMP gives every thread that runs a parallel torch operation a team of worker threads of
its own, and once a process holds more of them than it has cores, libgomp stops letting idle
workers wait for the next operation awake: each of the thousands of small operations of a
decoding pass then pays to wake them. Measured on 2 cores: an element-wise operation on a
144 x 576 tensor takes 0.03 ms on the first thread that runs one and 0.16 ms on any thread
once a second thread has run one; a served Conductor request 0.50 s instead of 0.70 s, a
16-row batch 2.1 s instead of 2.6 s. Work asked for from several threads (a server's loader,
its warm-up, every request through ``asyncio.to_thread``, several policies in one process)
therefore runs here, one piece at a time, which is also how the CPU would run it.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_executor: ThreadPoolExecutor | None = None
_thread_id: int | None = None
_default_threads = 1
_lock = threading.Lock()


def run_on_torch_thread(work: Callable[..., Any], *args: Any) -> Any:
    """``work(*args)`` on the torch thread, waiting for it (inline when already there); its
    result or its exception."""
    if threading.get_ident() == _thread_id:
        return work(*args)
    return _torch_executor().submit(work, *args).result()


def default_torch_threads() -> int:
    """torch's CPU thread count when the torch thread started (every core, unless the
    environment says otherwise): for work that asks for none, after work that asked for
    fewer."""
    if threading.get_ident() != _thread_id:  # noted when the thread starts
        _torch_executor().submit(lambda: None).result()
    return _default_threads


def set_torch_threads(count: int) -> None:
    """``torch.set_num_threads(count)`` for the calling thread, made to last.

    torch initialises a thread's count lazily, at its first parallel operation, to the count
    the process last set from any thread; a thread that set its own count before that (a
    draw thread set to one while the torch thread sets two) got the other thread's count,
    and with it an OpenMP team of its own, which slowed every thread
    (a 3-row prompt pass 0.19 s instead of 0.12 s). Asking for the count first runs that
    initialisation now.
    """
    import torch

    torch.get_num_threads()
    torch.set_num_threads(count)


async def in_torch_thread(work: Callable[..., Any], *args: Any) -> Any:
    """``work(*args)`` on the torch thread without blocking the event loop."""
    return await asyncio.get_running_loop().run_in_executor(_torch_executor(), work, *args)


def _torch_executor() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                1, thread_name_prefix="conductor-torch", initializer=_note_thread
            )
        return _executor


def _note_thread() -> None:
    import torch

    global _thread_id, _default_threads
    _thread_id = threading.get_ident()
    _default_threads = torch.get_num_threads()


def _forget_thread() -> None:
    # a forked child has the executor but not its thread: it starts its own on first use
    global _executor, _thread_id, _lock
    _executor, _thread_id, _lock = None, None, threading.Lock()


os.register_at_fork(after_in_child=_forget_thread)
