"""The machine probe: fills in :class:`~anyformer.contract._caps.Caps` from the GPU adapter (asked in a child
process), host memory, the cores this process may use and the model store's folder."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import shutil
import sys
from typing import Any

from anyformer.contract._caps import Caps
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.store._paths import anyformer_home

# Adapter names of CPU rasterisers that present themselves as Vulkan/Metal devices.
_SOFTWARE_ADAPTERS = ("llvmpipe", "lavapipe", "swiftshader", "softpipe", "microsoft basic render")

# Runs in a child process: a broken GPU driver can abort the process that asks it.
_WGPU_PROBE = r"""
import json, wgpu
out = {}
try:
    a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
except Exception as e:
    a = None
    out["error"] = str(e).splitlines()[0] if str(e) else type(e).__name__
if a is not None:
    info = dict(a.info)
    out["name"] = info.get("device") or info.get("description") or ""
    out["adapter_type"] = str(info.get("adapter_type", ""))
    out["backend"] = str(info.get("backend_type", ""))
    out["features"] = sorted(str(f) for f in a.features)
    out["limits"] = {k: int(v) for k, v in dict(a.limits).items() if isinstance(v, int)}
print(json.dumps(out))
"""


def host_ram_available() -> int:
    """Bytes of host memory available now, from psutil (``MemAvailable`` on Linux, the free and
    inactive pages on macOS, the available physical memory on Windows)."""
    import psutil  # asked by the probe and the backends' checks, not by `import anyformer`

    return int(psutil.virtual_memory().available)


def usable_cpu_count() -> int:
    """The cores this process may run on: its CPU affinity where the system has one, else the logical cores."""
    import psutil

    process = psutil.Process()
    if hasattr(process, "cpu_affinity"):  # Linux, Windows and FreeBSD; not macOS
        try:
            return len(process.cpu_affinity() or []) or psutil.cpu_count() or 1
        except (psutil.Error, OSError):
            pass
    return psutil.cpu_count() or 1


def _store_state() -> tuple[bool, str, int | None]:
    home = anyformer_home()
    probe_dir = home
    while not probe_dir.exists() and probe_dir.parent != probe_dir:
        probe_dir = probe_dir.parent
    # The store is a folder to write in: a file at ANYFORMER_HOME (or on the way to it) is no store.
    writable = probe_dir.is_dir() and os.access(probe_dir, os.W_OK | os.X_OK)
    try:
        free = shutil.disk_usage(probe_dir).free
    except OSError:
        free = None
    return writable, str(home), free


def _probe_wgpu(timeout: float = 20.0, *, use_cache: bool = True) -> dict[str, Any]:
    """The adapter's facts: from the cache when nothing that decides them changed, else from wgpu."""
    if importlib.util.find_spec("wgpu") is None:
        return {"error": "wgpu is not installed (pip install wgpu)"}
    from anyformer.machine import _adapter_cache

    cached = _adapter_cache.enabled()
    key = _adapter_cache.fingerprint() if cached else ""
    if cached and use_cache:
        facts = _adapter_cache.load_adapter_facts(key)
        if facts is not None:
            return facts
    facts, answered = _ask_wgpu(timeout)
    if cached and answered:  # a crash or a time-out is not a fact about the adapter: ask again next time
        _adapter_cache.store_adapter_facts(key, facts)
    return facts


def _ask_wgpu(timeout: float) -> tuple[dict[str, Any], bool]:
    """Ask wgpu in a child process; the flag says whether the child answered (adapter or not)."""
    import subprocess  # the probe is rare; `import anyformer` stays light

    try:
        done = subprocess.run(
            [sys.executable, "-c", _WGPU_PROBE], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"the GPU probe failed: {exc}"}, False
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"the GPU probe exited with {done.returncode}"}, False
    try:
        facts = json.loads(lines[-1])
    except json.JSONDecodeError:
        return {"error": "the GPU probe printed no result"}, False
    return (facts, True) if isinstance(facts, dict) else ({"error": "the GPU probe printed no result"}, False)


def _gpu_fields(raw: dict[str, Any]) -> dict[str, Any]:
    if "name" not in raw:
        return {"gpu_note": raw.get("error", "no GPU adapter")}
    name = raw["name"]
    adapter_type = raw.get("adapter_type", "")
    software = "cpu" in adapter_type.lower() or any(s in name.lower() for s in _SOFTWARE_ADAPTERS)
    allow_software = os.environ.get("ANYFORMER_SOFTWARE_GPU") == "1"
    features = set(raw.get("features", []))
    limits = raw.get("limits", {})
    is_gpu = not software or allow_software
    note = ""
    if software:
        note = (
            "software adapter, counted as a GPU (ANYFORMER_SOFTWARE_GPU=1)"
            if allow_software
            else ("software adapter, not a GPU (set ANYFORMER_SOFTWARE_GPU=1 to use it)")
        )
    return {
        "gpu": is_gpu,
        "gpu_name": name,
        "gpu_type": adapter_type or None,
        "f16": is_gpu and "shader-f16" in features,
        "subgroups": is_gpu and "subgroup" in features,
        "gpu_limits": limits,
        "gpu_note": note,
    }


def _gpu_memory_fields(fields: dict[str, Any], *, ask_vulkan: bool = True) -> dict[str, Any]:
    """The GPU memory fields: asked apart from wgpu (llama.cpp's CUDA build offloads layers whether or
    not wgpu is installed), from the first source that knows them (machine/_gpu_memory.py)."""
    from anyformer.machine._gpu_memory import SOURCES, from_vulkan, gpu_memory

    if fields.get("gpu") and fields.get("gpu_type") == "CPU":
        # A software adapter counted as a GPU (ANYFORMER_SOFTWARE_GPU=1) allocates host memory.
        return {"gpu_bytes": fields["ram_bytes"], "gpu_total_bytes": None, "gpu_memory_source": "host"}
    reading = gpu_memory(SOURCES if ask_vulkan else tuple(s for s in SOURCES if s is not from_vulkan))
    if reading is None:
        return {}
    return {
        "gpu_bytes": reading.free_bytes,
        "gpu_total_bytes": reading.total_bytes,
        "gpu_memory_source": reading.source,
    }


@functools.lru_cache(maxsize=4)
def _probe_cached(with_gpu: bool, fresh_adapter: bool = False) -> Caps:
    writable, store_path, free = _store_state()
    fields: dict[str, Any] = {
        "ram_bytes": host_ram_available(),
        "store": writable and (free is None or free > 0),
        "store_path": store_path,
        "disk_free_bytes": free,
        "cpu_count": usable_cpu_count(),
    }
    if with_gpu:
        adapter = _probe_wgpu(use_cache=not fresh_adapter)
        fields.update(_gpu_fields(adapter))
        # Where wgpu saw the adapters and none is a GPU, Vulkan (which wgpu asked) has none to report either.
        ask_vulkan = "name" not in adapter or bool(fields.get("gpu"))
        fields.update(_gpu_memory_fields(fields, ask_vulkan=ask_vulkan))
    else:
        fields["gpu_note"] = "GPU not probed"
    return Caps(**fields)


def probe(*, gpu: bool = True, refresh: bool = False, **overrides: Any) -> Caps:
    """Read the machine's capabilities once per process; keyword arguments override fields.

    ``gpu=False`` skips the adapter probe (it starts a child process that asks wgpu, which takes
    a moment and which a broken driver cannot crash us through). The adapter's facts are kept on
    disk (``ANYFORMER_HOME/probe/adapter.json``) while the machine, its driver and wgpu stay the
    same; ``refresh=True`` asks the driver again, ``ANYFORMER_PROBE_CACHE=0`` never keeps them.
    """
    if refresh:
        _probe_cached.cache_clear()
    caps = _probe_cached(gpu, refresh)
    unknown = set(overrides) - {f.name for f in dataclasses.fields(Caps)}
    if unknown:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"unknown capability field {', '.join(sorted(unknown))}")
    return caps.replace(**overrides) if overrides else caps
