"""What this machine can do (docs/contract.md, "Capabilities"): the GPU adapter, host memory and the model store."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Iterable
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.store._paths import anyformer_home

#: The capability flags ``--caps`` may name.
CAP_FLAGS = ("gpu", "f16", "subgroups", "store")

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


@dataclasses.dataclass(frozen=True)
class Caps:
    """The machine's capabilities, as the backends see them. Every field can be overridden."""

    gpu: bool = False
    gpu_name: str | None = None
    gpu_type: str | None = None
    f16: bool = False
    subgroups: bool = False
    gpu_bytes: int | None = None
    gpu_limits: dict[str, int] = dataclasses.field(default_factory=dict)
    ram_bytes: int = 0
    store: bool = False
    store_path: str | None = None
    disk_free_bytes: int | None = None
    cpu_count: int = 1
    #: Why the GPU fields are what they are (no wgpu, a software adapter, an override…).
    gpu_note: str = ""

    def replace(self, **changes: Any) -> Caps:
        """A copy with some fields changed: the what-if question."""
        return dataclasses.replace(self, **changes)

    def with_flags(self, flags: Iterable[str]) -> Caps:
        """A copy where the boolean capabilities are exactly ``flags`` (``gpu,f16,subgroups,store``)."""
        wanted = {f.strip().lower() for f in flags if f.strip()}
        unknown = wanted - set(CAP_FLAGS)
        if unknown:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"unknown capability {', '.join(sorted(unknown))}; choose from {', '.join(CAP_FLAGS)}",
            )
        return self.replace(
            gpu="gpu" in wanted,
            f16="f16" in wanted,
            subgroups="subgroups" in wanted,
            store="store" in wanted,
            gpu_note="set by --caps",
        )

    def to_dict(self) -> dict[str, Any]:
        """The capabilities as JSON-ready data."""
        return dataclasses.asdict(self)


def host_ram_available() -> int:
    """Bytes of host memory available now (``MemAvailable``), or the physical total where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def usable_cpu_count() -> int:
    """The cores this process may run on (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:
        return os.cpu_count() or 1


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
    from anyformer.contract import _adapter_cache

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


def _nvidia_free_bytes(timeout: float = 10.0) -> int | None:
    """Free memory of the first NVIDIA GPU from ``nvidia-smi``, or None where there is none.

    Asked apart from wgpu: llama.cpp's CUDA build offloads layers whether or not wgpu is installed.
    """
    import shutil as _shutil

    smi = _shutil.which("nvidia-smi")
    if smi is None:
        return None
    import subprocess  # only where there is an NVIDIA driver to ask

    try:
        done = subprocess.run(
            [smi, "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        first = done.stdout.strip().splitlines()[0]
        return int(float(first)) * 2**20 if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, IndexError, ValueError):
        return None


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
        fields.update(_gpu_fields(_probe_wgpu(use_cache=not fresh_adapter)))
        fields["gpu_bytes"] = _nvidia_free_bytes()
        if fields["gpu_bytes"] is None and fields.get("gpu") and fields.get("gpu_type") == "CPU":
            # A software adapter counted as a GPU (ANYFORMER_SOFTWARE_GPU=1) allocates host memory.
            fields["gpu_bytes"] = fields["ram_bytes"]
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
