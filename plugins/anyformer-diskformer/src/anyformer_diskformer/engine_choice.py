"""Which engine runs a loaded model and on which device: the ``device`` option, the device's memory, the family's
engine classes (from :mod:`~anyformer_diskformer.arch.registry`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anyformer.plugin import AnyformerError, ErrorCode, Request, probe
from anyformer_diskformer.arch.moe_config import MoEConfig
from anyformer_diskformer.arch.registry import ARCHITECTURES

if TYPE_CHECKING:
    from anyformer_diskformer.engines.cpu.moe import CpuMoEEngine
    from anyformer_diskformer.engines.gpu.moe import GpuMoEEngine
    from anyformer_gguf_gpu.gpu import GPU


def open_device(options: dict[str, object]) -> GPU | None:
    """The GPU the ``device`` load option asks for: ``auto`` (the default) a GPU when wgpu finds one (a
    software adapter only with ``ANYFORMER_SOFTWARE_GPU=1``), else None for the CPU; ``gpu`` one or the
    error why not; ``cpu`` None."""
    wanted = options.get("device", "auto")
    if wanted not in ("auto", "cpu", "gpu"):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"device must be auto, cpu or gpu, not {wanted!r}")
    if wanted == "cpu":
        return None
    from anyformer_gguf_gpu.gpu import GPU

    try:
        return GPU()
    except AnyformerError:
        if wanted == "gpu":
            raise
        return None


def cpu_engine_class(config: MoEConfig) -> type[CpuMoEEngine]:
    """The CPU engine for ``config``'s architecture: its family's spec names it
    (:mod:`~anyformer_diskformer.arch.registry`)."""
    return ARCHITECTURES[config.architecture].cpu_engine()


def gpu_engine_class(config: MoEConfig) -> type[GpuMoEEngine]:
    """The wgpu engine for ``config``'s architecture: its family's spec names it
    (:mod:`~anyformer_diskformer.arch.registry`)."""
    return ARCHITECTURES[config.architecture].gpu_engine()


def device_limit(request: Request, gpu: GPU | None) -> int | None:
    """The bytes the device may hold: the request's budget or the probe's GPU memory on a GPU (host memory
    where the probe knows no GPU size: a software adapter's memory is host memory), the probe's host
    memory on the CPU."""
    if gpu is None:
        return probe(gpu=False).ram_bytes
    if request.budget is not None:
        return request.budget
    caps = probe()
    return caps.gpu_bytes if caps.gpu_bytes else caps.ram_bytes
