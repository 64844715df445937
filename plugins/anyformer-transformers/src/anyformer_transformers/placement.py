"""Where a model runs: the GPU torch can drive (CUDA, ROCm, MPS) or the CPU, in which dtype, and how much where.

``can_run`` asks from the caps (no torch import): a GPU the caps list whose runtime the installed
torch was built for (``installed.gpu_runtime``: CUDA or ROCm, named by NVML/nvidia-smi or
amd-smi/rocm-smi; Metal on macOS, where torch has MPS). ``load`` asks torch itself
(:func:`torch_gpu`): the device and its free memory now. Both give :func:`place` the same inputs.

The choice, for one model (:func:`place`):

1. On a GPU, in its dtype (:func:`gpu_dtype`: bfloat16 on CUDA/ROCm, float16 when the checkpoint
   is float16 or the device is MPS): everything on the device when weights, cache, activations and
   the runtime's context fit the budget (``Request.budget``, else the GPU's free memory).
2. Else, with accelerate installed, a split (CUDA/ROCm only): the cache, activations and context
   on the device and as many weights as the rest of the budget holds; the other weights in host
   memory, which must hold them (the host-memory check). accelerate's ``device_map="auto"`` with
   ``max_memory`` does the split; the layers left on the host run there, slower.
3. Else the CPU plans (float32, then bfloat16) on host memory.

Nothing here was run on a real GPU: the choice is tested with fake caps, and loading with a
CPU-only accelerate map (docs/backends/transformers.md says so).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from anyformer.plugin import Caps, format_size
from anyformer_transformers.estimate import RUNTIME_OVERHEAD, Plan
from anyformer_transformers.installed import Installed

#: Device bytes the runtime takes before any tensor: the CUDA context, cuBLAS workspaces, the allocator's slack.
GPU_CONTEXT = 512 * 2**20
#: A split is offered only when the device holds at least this share of the weights (less is slower than the CPU).
MIN_SPLIT_SHARE = 0.1
#: Which memory sources mean which GPU runtime.
_CUDA_SOURCES = ("nvml", "nvidia-smi")
_ROCM_SOURCES = ("amd-smi", "rocm-smi")


@dataclasses.dataclass(frozen=True)
class Gpu:
    """A GPU torch can drive: its torch device name, the bytes offered, and whether accelerate can split onto it."""

    device: str
    budget: int | None
    can_split: bool


def accelerate_installed() -> bool:
    """Whether accelerate (the split loads' device map) is importable; it is an optional extra."""
    return importlib.util.find_spec("accelerate") is not None


def caps_gpu(caps: Caps, have: Installed, budget: int | None) -> tuple[Gpu | None, str]:
    """The GPU ``can_run`` may place on, from the caps alone, or None; and why not, when not."""
    if not caps.gpu:
        return None, ""
    offered = budget if budget is not None else caps.gpu_bytes
    source = caps.gpu_memory_source
    cuda = have.gpu_runtime == "cuda" and source in _CUDA_SOURCES
    if cuda or (have.gpu_runtime == "hip" and source in _ROCM_SOURCES):  # torch names a ROCm GPU "cuda" too
        return Gpu("cuda", offered, accelerate_installed()), ""
    if sys.platform == "darwin" and source == "metal":
        return Gpu("mps", offered, False), ""
    if have.gpu_runtime is None and sys.platform != "darwin":
        return None, f"torch {have.torch} is a CPU build: the GPU is not used"
    return None, f"torch {have.torch} has no runtime for this GPU ({caps.gpu_name or source or 'unknown'})"


def torch_gpu(budget: int | None) -> Gpu | None:
    """The GPU torch sees now (the first CUDA/ROCm device, or MPS) with its free memory, or None."""
    import torch

    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(0)
        return Gpu("cuda", budget if budget is not None else int(free), accelerate_installed())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return Gpu("mps", budget, False)
    return None


def gpu_dtype(device: str, stored: str) -> str:
    """The dtype weights are held in on ``device``: float16 on MPS or for a float16 checkpoint, else bfloat16."""
    return "float16" if device == "mps" or stored == "float16" else "bfloat16"


def _on_gpu(plan: Plan, gpu: Gpu, ram: int) -> Plan | None:
    """``plan`` (a host plan in the GPU dtype) on the device whole, or split by accelerate; None if neither fits."""
    total = plan.ram_bytes - RUNTIME_OVERHEAD + GPU_CONTEXT
    if gpu.budget is None or total <= gpu.budget:
        return dataclasses.replace(plan, device=gpu.device, gpu_bytes=total, ram_bytes=RUNTIME_OVERHEAD)
    if not gpu.can_split:
        return None
    beside = total - plan.weights  # the cache, activations and context stay on the device
    on_device = gpu.budget - beside
    if on_device < MIN_SPLIT_SHARE * plan.weights:
        return None
    on_host = plan.weights - on_device
    host = on_host + RUNTIME_OVERHEAD
    if host > ram:
        return None
    return dataclasses.replace(
        plan,
        device=gpu.device,
        gpu_bytes=gpu.budget,
        ram_bytes=host,
        max_memory={0: on_device, "cpu": on_host + RUNTIME_OVERHEAD},
    )


def place(
    host_plans: Callable[[tuple[str, ...] | None], list[Plan]], stored: str, gpu: Gpu | None, ram: int
) -> tuple[Plan | None, list[Plan]]:
    """The plan chosen (None when nothing fits) and every candidate judged, GPU first (module docstring).

    ``host_plans(dtypes)`` gives the all-in-host-memory plans for those dtypes (None: the CPU's).
    """
    candidates: list[Plan] = []
    if gpu is not None:
        (whole,) = host_plans((gpu_dtype(gpu.device, stored),))
        placed = _on_gpu(whole, gpu, ram)
        if placed is not None:
            return placed, [placed]
        candidates.append(
            dataclasses.replace(whole, device=gpu.device, gpu_bytes=whole.ram_bytes - RUNTIME_OVERHEAD + GPU_CONTEXT)
        )
    cpu = host_plans(None)
    candidates.extend(cpu)
    return next((plan for plan in cpu if plan.ram_bytes <= ram), None), candidates


def describe(plan: Plan) -> dict[str, Any]:
    """What ``anyformer check`` shows of a plan: device, dtype, and the split when there is one."""
    shown: dict[str, Any] = {"device": plan.device, "dtype": plan.dtype}
    if plan.max_memory is not None:
        on_host = plan.weights - plan.max_memory.get(0, 0)
        shown["offload"] = (
            f"{format_size(on_host)} of {format_size(plan.weights)} of weights in host memory "
            "(accelerate's device map); those layers run on the CPU"
        )
    return shown
