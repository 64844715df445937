"""Free and total accelerator memory, from whatever the platform offers (docs/contract.md, "Capabilities").

The sources are asked in order and the first that answers wins, named in ``caps.gpu_memory_source``:
NVML (the NVIDIA driver's library, through ctypes), ``nvidia-smi``, ``amd-smi``, ``rocm-smi``,
Metal's recommended working set (macOS), and Vulkan's memory-budget extension (any vendor; asked in a
child process, since a broken driver can abort the process that asks it). A missing tool is skipped,
never read as 0 bytes: where none answers, the memory is unknown (None).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

_MIB = 2**20
#: Seconds a command-line tool or the Vulkan child has to answer.
_TIMEOUT = 10.0


@dataclasses.dataclass(frozen=True)
class GpuMemory:
    """One accelerator's memory as one source reports it."""

    free_bytes: int | None
    total_bytes: int | None
    #: What answered: ``nvml``, ``nvidia-smi``, ``amd-smi``, ``rocm-smi``, ``metal`` or ``vulkan``.
    source: str
    device: str | None = None


def _known(value: int | None) -> int | None:
    return value if value is not None and value > 0 else None


def _answer(free: int | None, total: int | None, source: str, device: str | None = None) -> GpuMemory | None:
    """A reading, or None when it says nothing (no total: a tool that printed zeros knows nothing)."""
    total = _known(total)
    if total is None:
        return None
    free = free if free is not None and 0 <= free <= total else None
    return GpuMemory(free, total, source, device)


def _run(argv: list[str]) -> str | None:
    tool = shutil.which(argv[0])
    if tool is None:
        return None
    try:
        done = subprocess.run([tool, *argv[1:]], capture_output=True, text=True, timeout=_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def _load_nvml() -> Any:
    names = ["nvml.dll"] if sys.platform == "win32" else ["libnvidia-ml.so.1", ctypes.util.find_library("nvidia-ml")]
    for name in names:
        if name:
            try:
                return ctypes.CDLL(name)
            except OSError:
                continue
    return None


def from_nvml(load: Callable[[], Any] = _load_nvml) -> GpuMemory | None:
    """The first NVIDIA GPU's memory from NVML (``nvmlDeviceGetMemoryInfo``), or None without the library."""
    nvml = load()
    if nvml is None or nvml.nvmlInit_v2() != 0:
        return None
    try:
        handle = ctypes.c_void_p()
        if nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) != 0:
            return None
        memory = _NvmlMemory()
        if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0:
            return None
        name = ctypes.create_string_buffer(96)
        named = nvml.nvmlDeviceGetName(handle, name, ctypes.c_uint(len(name))) == 0
        return _answer(memory.free, memory.total, "nvml", name.value.decode(errors="replace") if named else None)
    finally:
        nvml.nvmlShutdown()


def from_nvidia_smi(run: Callable[[list[str]], str | None] = _run) -> GpuMemory | None:
    """The first NVIDIA GPU's memory from ``nvidia-smi``."""
    out = run(["nvidia-smi", "--query-gpu=memory.free,memory.total,name", "--format=csv,noheader,nounits"])
    if not out or not out.strip():
        return None
    try:
        free, total, name = (part.strip() for part in out.strip().splitlines()[0].split(",", 2))
        return _answer(int(float(free)) * _MIB, int(float(total)) * _MIB, "nvidia-smi", name)
    except ValueError:
        return None


def _walk(data: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield str(key), value
            yield from _walk(value)
    elif isinstance(data, list):
        for item in data:
            yield from _walk(item)


def _bytes_of(value: Any, unit: str = "B") -> int | None:
    """A size as amd-smi/rocm-smi print it: a number, a numeric string, or ``{"value": 16368, "unit": "MB"}``."""
    if isinstance(value, dict):
        return _bytes_of(value.get("value"), str(value.get("unit", unit)))
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    scale = {"B": 1, "KB": 2**10, "MB": _MIB, "MIB": _MIB, "GB": 2**30, "GIB": 2**30}.get(unit.upper())
    return int(number * scale) if scale else None


def from_amd_smi(run: Callable[[list[str]], str | None] = _run) -> GpuMemory | None:
    """The first AMD GPU's VRAM from ``amd-smi metric --mem-usage --json`` (total, used, free)."""
    out = run(["amd-smi", "metric", "--mem-usage", "--json"])
    try:
        data = json.loads(out) if out else None
    except json.JSONDecodeError:
        return None
    found: dict[str, int | None] = {}
    for key, value in _walk(data):
        for field in ("total_vram", "used_vram", "free_vram"):
            if key.lower() == field and field not in found:
                found[field] = _bytes_of(value, "MB")
    total, used, free = found.get("total_vram"), found.get("used_vram"), found.get("free_vram")
    if free is None and total is not None and used is not None:
        free = total - used
    return _answer(free, total, "amd-smi")


def from_rocm_smi(run: Callable[[list[str]], str | None] = _run) -> GpuMemory | None:
    """The first AMD GPU's VRAM from ``rocm-smi --showmeminfo vram --json`` (bytes, total and used)."""
    out = run(["rocm-smi", "--showmeminfo", "vram", "--json"])
    try:
        data = json.loads(out) if out else None
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    for card in data.values():
        if isinstance(card, dict):
            total = _bytes_of(card.get("VRAM Total Memory (B)"))
            used = _bytes_of(card.get("VRAM Total Used Memory (B)"))
            reading = _answer(total - used if total is not None and used is not None else None, total, "rocm-smi")
            if reading is not None:
                return reading
    return None


def _metal_device() -> tuple[Any, Callable[[Any, str, Any], Any]] | None:
    """Metal's default device and a message sender (objc_msgSend), or None off macOS or without a GPU."""
    try:
        metal = ctypes.CDLL("/System/Library/Frameworks/Metal.framework/Metal")
        objc = ctypes.CDLL(ctypes.util.find_library("objc") or "libobjc.dylib")
    except OSError:
        return None
    metal.MTLCreateSystemDefaultDevice.restype = ctypes.c_void_p
    device = metal.MTLCreateSystemDefaultDevice()
    if not device:
        return None
    objc.sel_registerName.restype = ctypes.c_void_p
    objc.sel_registerName.argtypes = [ctypes.c_char_p]

    def send(receiver: Any, selector: str, restype: Any) -> Any:
        objc.objc_msgSend.restype = restype
        objc.objc_msgSend.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        return objc.objc_msgSend(receiver, objc.sel_registerName(selector.encode()))

    return device, send


def from_metal(open_device: Callable[[], Any] = _metal_device) -> GpuMemory | None:
    """Metal's recommended working set (what a process may keep on the GPU) less what is allocated now."""
    if sys.platform != "darwin" and open_device is _metal_device:
        return None
    opened = open_device()
    if opened is None:
        return None
    device, send = opened
    total = int(send(device, "recommendedMaxWorkingSetSize", ctypes.c_uint64))
    allocated = int(send(device, "currentAllocatedSize", ctypes.c_uint64))
    name_object = send(device, "name", ctypes.c_void_p)
    name = send(name_object, "UTF8String", ctypes.c_char_p) if name_object else None
    return _answer(total - allocated, total, "metal", name.decode(errors="replace") if name else None)


def from_vulkan(timeout: float = _TIMEOUT) -> GpuMemory | None:
    """The first GPU's device-local budget from Vulkan's VK_EXT_memory_budget, asked in a child process."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "anyformer.machine._vulkan_budget"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        facts = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout else None
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError, IndexError):
        return None
    if not isinstance(facts, dict):
        return None
    return _answer(facts.get("free"), facts.get("total"), "vulkan", facts.get("device"))


#: The sources in the order they are asked: the vendor's own library and tools before the generic ones.
SOURCES: tuple[Callable[[], GpuMemory | None], ...] = (
    from_nvml,
    from_nvidia_smi,
    from_amd_smi,
    from_rocm_smi,
    from_metal,
    from_vulkan,
)


def gpu_memory(sources: tuple[Callable[[], GpuMemory | None], ...] = SOURCES) -> GpuMemory | None:
    """The first source's reading that knows the memory, or None when no source answers."""
    for source in sources:
        try:
            reading = source()
        except (OSError, AttributeError, ValueError, TypeError):
            reading = None  # a library of another version or a driver that answers nonsense: the next source
        if reading is not None:
            return reading
    return None
