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


def device_used_gib(device: str) -> float | None:
    """Memory in use on the whole device now (every allocator and process: vLLM's pool,
    the CUDA context, NCCL buffers), or ``None`` off CUDA."""
    import torch

    if device != "cuda":
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / GIB


class DeviceMemorySampler:
    """The largest device-wide use seen at the moments it is sampled (step ends)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.max_gib: float | None = None

    def sample(self) -> None:
        used = device_used_gib(self.device)
        if used is not None:
            self.max_gib = used if self.max_gib is None else max(self.max_gib, used)


@contextlib.contextmanager
def peak_memory(
    device: str, into: dict[str, Any], sampler: DeviceMemorySampler | None = None
) -> Iterator[None]:
    """Record the section's peak GPU memory in ``into`` (nothing on CPU).

    ``peak_device_gib`` estimates the device-wide peak: what was in use before the section
    plus the growth of PyTorch's reserved pool up to its peak (vLLM colocated in this
    process allocates through PyTorch too), and never less than the device-wide use
    ``sampler`` saw at step ends (which also holds allocations outside PyTorch), nor than
    the peaks of the phases the section measured apart (``phase_peaks_gib``)."""
    import torch

    if device != "cuda":
        yield
        return
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    used_before = device_used_gib(device) or 0.0
    reserved_before = torch.cuda.memory_reserved() / GIB
    try:
        yield
    finally:
        torch.cuda.synchronize()
        peak_reserved = torch.cuda.max_memory_reserved() / GIB
        estimate = used_before + peak_reserved - reserved_before
        if sampler is not None and sampler.max_gib is not None:
            estimate = max(estimate, sampler.max_gib)
        # a section that resets the peak counters between its phases reports their peaks
        estimate = max([estimate, *into.get("phase_peaks_gib", {}).values()])
        into["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 2)
        into["peak_reserved_gib"] = round(peak_reserved, 2)
        into["peak_device_gib"] = round(estimate, 2)
