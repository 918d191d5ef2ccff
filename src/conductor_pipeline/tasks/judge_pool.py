"""Judge answers in child processes, each call under a wall-clock limit.

Some verifiers hand a model's answer to a general expression parser (math-verify and
sympy for ``math``, reasoning-gym's scorers). A thirteen-character answer such as
``10^{10^{10}}`` can keep such a parser busy for hours while it holds the GIL, so no
thread of the calling process runs again: a timer thread cannot interrupt it, and
math-verify's own limit (SIGALRM) works only in the main thread. A process can always be
stopped, so these verifiers run here: a few long-lived children (started once, so the
parser's import is paid once) answer one judgement at a time; a call that outlives its
limit kills its child, which is replaced on the next call, and comes back as a wrong
answer whose reason names the limit.

Protocol on the child's stdin/stdout: length-prefixed pickles, ``(task, response)`` in,
the verdict's fields out. Only this module writes to the child, so the pickles are ours.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import queue
import select
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Any

__all__ = ["DEFAULT_TIME_LIMIT_S", "JudgePool", "judge", "time_limit_s"]

DEFAULT_TIME_LIMIT_S = 10.0
# how long a new child may take to import its parsers before it is given up on
_START_LIMIT_S = 120.0
_HEADER = struct.Struct("!I")
# a judgement takes milliseconds: a child per core is plenty, and each holds its parsers' memory
_MAX_CHILDREN = max(1, min(4, os.cpu_count() or 1))
_CHILD_COMMAND = "from conductor_pipeline.tasks.judge_pool import child_main; child_main()"


def time_limit_s() -> float:
    """The limit on one judgement: ``CONDUCTOR_VERIFY_TIME_LIMIT_S`` or 10 s."""
    raw = os.environ.get("CONDUCTOR_VERIFY_TIME_LIMIT_S")
    if raw is None or not raw.strip():
        return DEFAULT_TIME_LIMIT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f"CONDUCTOR_VERIFY_TIME_LIMIT_S must be a number of seconds, got {raw!r}"
        ) from None
    if not value > 0:
        raise ValueError(f"CONDUCTOR_VERIFY_TIME_LIMIT_S must be above 0, got {raw!r}")
    return value


class JudgeTimeout(Exception):
    """The child did not answer within the limit (it has been killed)."""


class JudgeDied(Exception):
    """The child exited or wrote something unreadable (it has been killed)."""


def _write(stream: IO[bytes], payload: Any) -> None:
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_exact(fd: int, size: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    while size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise JudgeTimeout
        chunk = os.read(fd, size)
        if not chunk:
            raise JudgeDied("the judge process closed its output")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _read(fd: int, limit_s: float | None) -> Any:
    deadline = None if limit_s is None else time.monotonic() + limit_s
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    return pickle.loads(_read_exact(fd, size, deadline))


class _Child:
    """One judge process."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _CHILD_COMMAND],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # a Ctrl-C in the terminal is for the parent, which then stops its children
            start_new_session=True,
        )
        try:
            if _read(self.process.stdout.fileno(), _START_LIMIT_S) != "ready":
                raise JudgeDied("the judge process did not start properly")
        except (JudgeTimeout, JudgeDied, pickle.UnpicklingError, struct.error) as exc:
            self.kill()
            raise RuntimeError(
                f"could not start a judge process ({sys.executable} -c {_CHILD_COMMAND!r}): "
                f"{exc or type(exc).__name__}"
            ) from exc

    def ask(self, task: Any, response: str, limit_s: float) -> tuple[bool, float, Any, str]:
        try:
            _write(self.process.stdin, (task, response))
            return _read(self.process.stdout.fileno(), limit_s)
        except (BrokenPipeError, pickle.UnpicklingError, struct.error, EOFError) as exc:
            raise JudgeDied(str(exc) or type(exc).__name__) from exc

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):  # what was left unwritten to a dead child
                stream.close()


class JudgePool:
    """Up to ``max_children`` judge processes shared by every thread of this process."""

    def __init__(self, max_children: int = _MAX_CHILDREN) -> None:
        self.max_children = max_children
        self.idle: queue.SimpleQueue[_Child] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.started = 0
        self.owner = os.getpid()

    def _take(self) -> _Child:
        try:
            return self.idle.get_nowait()
        except queue.Empty:
            pass
        with self.lock:
            grow = self.started < self.max_children
            if grow:
                self.started += 1
        if not grow:
            return self.idle.get()
        try:
            return _Child()
        except BaseException:
            with self.lock:
                self.started -= 1
            raise

    def _retire(self, child: _Child) -> None:
        child.kill()
        with self.lock:
            self.started -= 1

    def judge(self, task: Any, response: str, limit_s: float) -> tuple[bool, float, Any, str]:
        """``(correct, score, extracted, reason)`` for ``response`` to ``task``, from a child."""
        child = self._take()
        try:
            answer = child.ask(task, response, limit_s)
        except JudgeTimeout:
            self._retire(child)
            return (False, 0.0, None, f"verification stopped at its time limit of {limit_s:g} s")
        except JudgeDied as exc:
            code = child.process.poll()
            self._retire(child)
            return (False, 0.0, None, f"the verifier's process died ({exc}; exit code {code})")
        except BaseException:
            self._retire(child)
            raise
        self.idle.put(child)
        return answer

    def close(self) -> None:
        while True:
            try:
                child = self.idle.get_nowait()
            except queue.Empty:
                return
            self._retire(child)


_pool: JudgePool | None = None
_pool_lock = threading.Lock()


def _shared_pool() -> JudgePool:
    global _pool
    with _pool_lock:
        # a forked child must not share its parent's pipes
        if _pool is None or _pool.owner != os.getpid():
            _pool = JudgePool()
        return _pool


def _close_shared_pool() -> None:
    if _pool is not None and _pool.owner == os.getpid():
        _pool.close()


atexit.register(_close_shared_pool)


def judge(task: Any, response: str, limit_s: float | None = None) -> tuple[bool, float, Any, str]:
    """Judge in a child process of the shared pool, within ``limit_s`` (default:
    :func:`time_limit_s`)."""
    return _shared_pool().judge(task, response, time_limit_s() if limit_s is None else limit_s)


def child_main() -> None:
    """The child's loop: read a request, judge it in this process, answer."""
    from conductor_pipeline.tasks.verifiers import judge_in_process, load_parsers

    # the protocol owns the original stdout; anything a library prints goes to stderr
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    load_parsers()  # before "ready": a call's limit is for judging, not for imports
    _write(out, "ready")
    fd = sys.stdin.fileno()
    while True:
        try:
            task, response = _read(fd, None)
        except JudgeDied:
            return
        verdict = judge_in_process(task, response)
        _write(out, (verdict.correct, verdict.score, verdict.extracted, verdict.reason))
