"""Several processes (``accelerate launch --num_processes N -m kedro run ...``).

Every process runs the whole Kedro pipeline; the trainer spreads the GRPO steps over them.
What must happen once (saving and copying adapters, writing the catalog's files, MLflow runs,
registry versions) happens on the main process only, and the others wait for it here.

The rank comes from the launcher's environment (``RANK``/``WORLD_SIZE``, set by
``accelerate launch`` and ``torchrun``), so it is known before any process group exists
(Kedro settings and hooks need it at start-up). Waiting and broadcasting use the process
group the trainer set up (accelerate's ``PartialState``); one process: no-ops.

Light: no torch or accelerate import until a collective is needed.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

__all__ = [
    "broadcast_from_main",
    "is_main_process",
    "num_processes",
    "process_index",
    "wait_for_everyone",
]

T = TypeVar("T")


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def process_index() -> int:
    """This process's global rank (0 when not launched as several processes)."""
    return max(_env_int("RANK", 0), 0)


def num_processes() -> int:
    """How many processes the launcher started (1 when not launched as several)."""
    return max(_env_int("WORLD_SIZE", 1), 1)


def is_main_process() -> bool:
    return process_index() == 0


def _state() -> Any:
    # the trainer created it already (same settings); otherwise this joins the process group
    # (gloo on CPU, as the trainer's ``use_cpu`` would)
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


def wait_for_everyone() -> None:
    """Barrier across the launched processes; returns at once in a single process."""
    if num_processes() > 1:
        _state().wait_for_everyone()


def broadcast_from_main(value: T) -> T:
    """The main process's ``value`` on every process (picklable values); each process must
    call it. A single process gets its own value back."""
    if num_processes() == 1:
        return value
    from accelerate.utils import broadcast_object_list

    _state()
    box = [value if is_main_process() else None]
    broadcast_object_list(box, from_process=0)
    return box[0]
