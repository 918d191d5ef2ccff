"""What the figures were measured on, and the timing and memory helpers every section uses."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import platform
from collections.abc import Iterator
from typing import Any

GIB = 1024**3


def module_version(name: str) -> str | None:
    """The installed version of ``name`` if it can be imported, else ``None`` (vLLM, TRL and
    the project's own training package are optional here)."""
    try:
        if importlib.util.find_spec(name) is None:
            return None
        module = importlib.import_module(name)
    except Exception:  # noqa: BLE001 - a broken optional install counts as absent
        return None
    return str(getattr(module, "__version__", "unknown"))


def package_version(name: str) -> str | None:
    """The installed distribution's version, read without importing it (importing TRL or
    vLLM takes seconds, and the no-CUDA answer should be quick)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def describe_environment(device: str) -> dict[str, Any]:
    """Versions and the device, so that figures can be compared across machines."""
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    for name in ("transformers", "peft", "accelerate", "trl", "datasets", "vllm"):
        info[name] = package_version(name)
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            device_name=props.name,
            device_capability=f"{props.major}.{props.minor}",
            device_count=torch.cuda.device_count(),
            gpu_total_gib=round(props.total_memory / GIB, 2),
            bf16_supported=torch.cuda.is_bf16_supported(),
        )
    return info


def synchronize(device: str) -> None:
    """Wait for queued kernels, so that wall-clock timings cover the work they name."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


@contextlib.contextmanager
def peak_memory(device: str, into: dict[str, Any]) -> Iterator[None]:
    """Record the section's peak allocated/reserved GPU memory in ``into`` (nothing on CPU)."""
    import torch

    if device != "cuda":
        yield
        return
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    try:
        yield
    finally:
        torch.cuda.synchronize()
        into["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 3)
        into["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / GIB, 3)
