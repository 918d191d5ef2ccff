"""Run a pipeline stage's work in a fresh process that exits when the stage is done.

``kedro run --env gpu`` trains and then evaluates in one process. Training leaves its model,
optimizer state and colocated vLLM engine on the GPU (Python frees none of it reliably), and
evaluation then launches ``vllm serve`` on the same device, which refuses to start without
the memory it was told to take. :func:`run_in_own_process` runs a stage's work in a child
started with ``spawn`` (a fresh interpreter: it inherits no CUDA context and no model) and
returns the child's result once the child has exited, so the operating system has taken
back everything the stage held before the next stage starts.

What stays as it was in one process:

* the result: the child's return value, pickled back;
* logging: the child's records pass through this process's loggers and handlers (Kedro's
  console, the run log), each still carrying the child's pid;
* errors: an exception raised in the child is raised here again, of its own type, with a
  note naming the stage, the child's pid and its traceback there; a child that dies without
  a result (killed, out of memory) raises :class:`StageProcessError` with its exit status.
  Files the stage wrote (checkpoints) stay where they are, so the same command resumes.

Light: no torch import here.
"""

from __future__ import annotations

import importlib
import logging
import logging.handlers
import multiprocessing
import pickle
import signal
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

# how long a child may take to exit once its result is here, then to end on SIGTERM
_EXIT_GRACE_S = 120.0
_TERMINATE_GRACE_S = 30.0
_CHAIN_DEPTH = 5


class StageProcessError(RuntimeError):
    """A stage's own process ended without handing back a result."""


def run_in_own_process(stage: str, target: Callable[..., T], *args: Any) -> T:
    """``target(*args)`` in a fresh ``spawn`` child; its result once the child has exited.

    ``target`` must be a module-level function, and ``args`` and the result picklable.
    """
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    records = context.Queue()
    listener = logging.handlers.QueueListener(records, _ForwardToLoggers())
    process = context.Process(
        target=_child_main,
        args=(send, records, _logger_levels(), target, args),
        name=f"conductor-{stage}",
    )
    listener.start()
    try:
        process.start()
        send.close()  # the child holds the only sending end: EOF when it dies
        logger.info("the %s stage runs in its own process (pid %d)", stage, process.pid)
        message = _wait_for_message(receive, process)
        process.join(_EXIT_GRACE_S)
        if process.is_alive():
            # a thread that never ends (an engine's) would keep its memory held: the result
            # is here, so the process is stopped
            logger.warning(
                "the %s stage's process had not exited %.0f s after handing back its "
                "result; stopping it",
                stage,
                _EXIT_GRACE_S,
            )
    finally:
        _end(process)
        listener.stop()
        receive.close()
        records.close()
    if message is None:
        raise StageProcessError(
            f"the {stage} stage's process (pid {process.pid}) ended with "
            f"{_describe_exit(process.exitcode)} before handing back its result. What it "
            "wrote so far (checkpoints) is kept: run the same command again to resume."
        )
    if message[0] == "ok":
        return pickle.loads(message[1])
    _, portable, summary, child_traceback = message
    note = (
        f"raised in the {stage} stage's own process (pid {process.pid}); its traceback "
        f"there:\n{child_traceback}"
    )
    error = _rebuild(portable)
    if error is None:
        raise StageProcessError(f"the {stage} stage failed: {summary}\n{note}")
    error.add_note(note)
    raise error


def _wait_for_message(receive, process) -> tuple | None:
    while True:
        if receive.poll(1.0):
            try:
                return receive.recv()
            except EOFError:
                return None
        if not process.is_alive() and not receive.poll(0):
            return None


def _end(process) -> None:
    if process.pid is None:
        return  # never started
    if process.is_alive():
        process.terminate()
        process.join(_TERMINATE_GRACE_S)
    if process.is_alive():
        process.kill()
    process.join()


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (SIGKILL: often the system running out of memory)" if -code == 9 else ""
        return f"{name}{hint}"
    return f"exit status {code}"


# -- logging across the process boundary ---------------------------------------------------


def _logger_levels() -> dict[str, int]:
    """The levels set in this process (root and named loggers), for the child to apply."""
    levels = {"": logging.getLogger().getEffectiveLevel()}
    for name, item in logging.Logger.manager.loggerDict.items():
        if isinstance(item, logging.Logger) and item.level != logging.NOTSET:
            levels[name] = item.level
    return levels


class _ForwardToLoggers(logging.Handler):
    """Hands a child's record to the logger of the same name here (whose handlers and
    filters then treat it as one of ours)."""

    def emit(self, record: logging.LogRecord) -> None:
        target = logging.getLogger(record.name)
        if target.isEnabledFor(record.levelno):
            target.handle(record)


def _send_logs_to_parent(records, levels: dict[str, int]) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(logging.handlers.QueueHandler(records))
    for name, level in levels.items():
        logging.getLogger(name or None).setLevel(level)
    logging.captureWarnings(True)


# -- the child ---------------------------------------------------------------------------


def _child_main(send, records, levels: dict[str, int], target: Callable, args: tuple) -> None:
    _send_logs_to_parent(records, levels)
    try:
        result = pickle.dumps(target(*args))  # an unpicklable result fails here, reported
    except BaseException as err:  # noqa: BLE001 - every failure goes back to the parent
        send.send(("error", _portable(err), f"{type(err).__name__}: {err}", traceback.format_exc()))
        send.close()
        raise SystemExit(1) from None
    send.send(("ok", result))
    send.close()


def _portable(err: BaseException | None, depth: int = 0) -> tuple | None:
    """``err`` as plain data (class path, args, attributes, cause), or None when it cannot
    travel. The parent rebuilds it without calling ``__init__``, whose signature may not
    match ``args`` (an error built from two strings keeps one in ``args``)."""
    if err is None or depth >= _CHAIN_DEPTH:
        return None
    cls = type(err)
    try:
        data = pickle.dumps((err.args, dict(vars(err))))
    except Exception:  # noqa: BLE001 - anything unpicklable stays behind
        return None
    cause = err.__cause__ or err.__context__
    return (cls.__module__, cls.__qualname__, data, _portable(cause, depth + 1))


def _rebuild(portable: tuple | None) -> BaseException | None:
    if portable is None:
        return None
    module, qualname, data, cause = portable
    try:
        cls: Any = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        args, attributes = pickle.loads(data)
        error = cls.__new__(cls)
        error.args = args
        error.__dict__.update(attributes)
    except Exception:  # noqa: BLE001 - a class this process cannot import or build
        return None
    error.__cause__ = _rebuild(cause)
    return error
