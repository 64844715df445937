"""One wgpu device for an engine: adapter choice, buffers, read-back, and GPU failures as AnyformerError.

wgpu is imported here and only here, when a device is opened: importing the library stays cheap.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode

# Adapter names of CPU rasterisers that present themselves as Vulkan/Metal devices (as the core's probe).
_SOFTWARE_ADAPTERS = ("llvmpipe", "lavapipe", "swiftshader", "softpipe", "microsoft basic render")

# Limits raised to what the adapter allows: model tensors are large, and an engine binds many buffers.
_RAISED_LIMITS = (
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-storage-buffers-per-shader-stage",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
)


def is_software(info: dict[str, Any]) -> bool:
    """Whether an adapter's info describes a CPU rasteriser (lavapipe, SwiftShader…)."""
    name = f"{info.get('device', '')} {info.get('description', '')}".lower()
    return "cpu" in str(info.get("adapter_type", "")).lower() or any(s in name for s in _SOFTWARE_ADAPTERS)


@contextlib.contextmanager
def gpu_errors(what: str) -> Iterator[None]:
    """Turn wgpu's failures (out of memory, device lost, validation) into ``AnyformerError``."""
    import wgpu  # type: ignore[import-untyped]

    try:
        yield
    except AnyformerError:
        raise
    except wgpu.GPUOutOfMemoryError as exc:
        raise AnyformerError(ErrorCode.OUT_OF_MEMORY, f"{what}: the GPU is out of memory ({exc})", cause=exc) from exc
    except (wgpu.GPUError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "memory" in first.lower():
            raise AnyformerError(ErrorCode.OUT_OF_MEMORY, f"{what}: the GPU is out of memory ({first})") from exc
        raise AnyformerError(ErrorCode.BACKEND_CRASHED, f"{what}: the GPU failed: {first}", cause=exc) from exc


class GPU:
    """An adapter and a device with the features the kernels may use (shader-f16, subgroups)."""

    def __init__(self, *, allow_software: bool | None = None) -> None:
        import wgpu  # type: ignore[import-untyped]

        if allow_software is None:
            allow_software = os.environ.get("ANYFORMER_SOFTWARE_GPU") == "1"
        with gpu_errors("opening the GPU"):
            adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            raise AnyformerError(ErrorCode.BACKEND_CRASHED, "no GPU adapter (wgpu found none)")
        self.info: dict[str, Any] = dict(adapter.info)
        if is_software(self.info) and not allow_software:
            raise AnyformerError(
                ErrorCode.BACKEND_CRASHED,
                f"the only adapter is a software one ({self.info.get('device')}); "
                "set ANYFORMER_SOFTWARE_GPU=1 to use it",
            )
        features = {str(f) for f in adapter.features}
        self.has_f16 = "shader-f16" in features
        self.has_subgroups = "subgroup" in features
        wanted = [f for f in ("shader-f16", "subgroup") if f in features]
        limits = {k: adapter.limits[k] for k in _RAISED_LIMITS if k in adapter.limits}
        with gpu_errors("opening the GPU"):
            self.device = adapter.request_device_sync(required_features=wanted, required_limits=limits)
        self.limits: dict[str, int] = {k: int(v) for k, v in dict(self.device.limits).items() if isinstance(v, int)}
        self.max_binding = int(self.limits.get("max-storage-buffer-binding-size", 128 << 20))
        self._wgpu = wgpu

    def close(self) -> None:
        """Destroy the device now: its poll thread stops (else it waits until Python collects the device).

        Call it once everything made on this device is released; a second call does nothing.
        """
        device, self.device = self.device, None
        if device is not None:
            device.destroy()

    @property
    def name(self) -> str:
        """The adapter's device name."""
        return str(self.info.get("device") or self.info.get("description") or "GPU")

    def buffer(self, nbytes: int, *, label: str = "", uniform: bool = False) -> Any:
        """A zeroed buffer of at least ``nbytes`` usable as storage (or uniform) and copied.

        Storage buffers get at least 4 bytes past ``nbytes`` (rounded up to 16): the kernels' unaligned
        4-byte reads of raw blocks may touch the word after the last byte.
        """
        usage = self._wgpu.BufferUsage
        kind = usage.UNIFORM if uniform else usage.STORAGE
        size = max(16, (int(nbytes) + (0 if uniform else 4) + 15) // 16 * 16)
        if size > int(self.limits.get("max-buffer-size", size)):
            raise AnyformerError(
                ErrorCode.OUT_OF_MEMORY, f"{label or 'a buffer'} needs {size} bytes, over the GPU's largest buffer"
            )
        with gpu_errors(f"allocating {label or 'a buffer'}"):
            return self.device.create_buffer(size=size, usage=kind | usage.COPY_DST | usage.COPY_SRC, label=label)

    def upload(self, data: np.ndarray | bytes, *, label: str = "", uniform: bool = False) -> Any:
        """A new buffer holding ``data`` (padded with zeros to a multiple of 16 bytes)."""
        raw = np.ascontiguousarray(np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data)
        flat = raw.reshape(-1).view(np.uint8)
        buf = self.buffer(flat.nbytes, label=label, uniform=uniform)
        self.write(buf, flat)
        return buf

    def write(self, buf: Any, data: np.ndarray, offset: int = 0) -> None:
        """Queue a write of ``data`` into ``buf`` at byte ``offset`` (ordered with later submissions)."""
        flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        pad = (-flat.nbytes) % 4
        if pad:
            flat = np.concatenate([flat, np.zeros(pad, dtype=np.uint8)])
        with gpu_errors("writing to the GPU"):
            self.device.queue.write_buffer(buf, offset, flat)

    def read(self, buf: Any, dtype: Any = np.float32, count: int | None = None, offset: int = 0) -> np.ndarray:
        """Copy ``count`` items of ``dtype`` from ``buf`` at byte ``offset`` back to the host (waits for the GPU)."""
        item = np.dtype(dtype).itemsize
        n = count if count is not None else (buf.size - offset) // item
        nbytes = (n * item + 3) // 4 * 4
        with gpu_errors("reading from the GPU"):
            data = self.device.queue.read_buffer(buf, offset, nbytes)
        return np.frombuffer(data, dtype=np.uint8)[: n * item].view(dtype).copy()

    def staging(self, nbytes: int, *, label: str = "") -> Any:
        """A small buffer the host maps to read results back."""
        usage = self._wgpu.BufferUsage
        with gpu_errors("allocating a read-back buffer"):
            return self.device.create_buffer(
                size=max(16, (nbytes + 15) // 16 * 16), usage=usage.MAP_READ | usage.COPY_DST, label=label
            )
