"""The GPU adapter's facts, remembered between commands.

Asking wgpu for its adapter takes a child process and about a second (wgpu's import and the
driver's start-up): more than the rest of a first ``anyformer run`` on a small model. The facts it
returns (name, type, backend, features, limits) change only when the machine, its driver or wgpu
changes, so they are kept in ``ANYFORMER_HOME/probe/adapter.json`` under a fingerprint of exactly
those: the boot id, wgpu's version and location, the interpreter, the Vulkan/ICD environment and
the ICD manifest files. Anything else (a reboot, a driver update, a new wgpu) probes anew. Free GPU
memory is never cached. ``ANYFORMER_PROBE_CACHE=0`` turns the cache off; ``anyformer caps`` and
``probe(refresh=True)`` always ask the driver and rewrite it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from anyformer.store._paths import anyformer_home

#: Environment variables that change which adapter wgpu picks or how.
_ADAPTER_ENV = ("VK_ICD_FILENAMES", "VK_DRIVER_FILES", "VK_ADD_DRIVER_FILES", "WGPU_BACKEND_TYPE", "WGPU_ADAPTER_NAME")
#: Folders holding the Vulkan driver manifests (a driver install or update touches them).
_ICD_FOLDERS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")
#: A cache file larger than this is not ours (the facts take a few KB).
_MAX_CACHE_BYTES = 1 << 20


def _cache_file() -> Path:
    return anyformer_home() / "probe" / "adapter.json"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""  # no boot id (macOS, Windows): the other parts still change with a driver or wgpu update


def _wgpu_identity() -> str:
    """wgpu's version and location, found without ``importlib.metadata`` (its import alone costs ~20 ms).

    The ``wgpu-*.dist-info`` names beside the package carry the version; the ``__init__.py``'s size and
    modification time change with any reinstall, a source checkout's included.
    """
    origin = getattr(importlib.util.find_spec("wgpu"), "origin", None)
    if not isinstance(origin, str):
        return ""
    init = Path(origin)
    versions = sorted(info.name for info in init.parent.parent.glob("wgpu-*.dist-info"))
    try:
        stat = init.stat()
    except OSError:
        return f"{versions}@{init}"
    return f"{versions}@{init}@{stat.st_size}@{stat.st_mtime_ns}"


def _icd_manifests() -> list[tuple[str, int, int]]:
    found = []
    for folder in _ICD_FOLDERS:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            try:
                stat = entry.stat()
            except OSError:
                continue
            found.append((entry.path, stat.st_size, stat.st_mtime_ns))
    return found


def fingerprint() -> str:
    """A digest of everything that decides the adapter's facts on this machine, as it is now."""
    parts = {
        "boot": _boot_id(),
        "wgpu": _wgpu_identity(),
        "python": os.path.realpath(sys.executable),  # `python` and `python3` are one interpreter
        "env": {name: os.environ.get(name) for name in _ADAPTER_ENV},
        "icd": _icd_manifests(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def enabled() -> bool:
    """Whether the cache may be read and written (``ANYFORMER_PROBE_CACHE=0`` turns it off)."""
    return os.environ.get("ANYFORMER_PROBE_CACHE", "1") != "0"


def load_adapter_facts(key: str) -> dict[str, Any] | None:
    """The facts cached under ``key``, or None (no cache, another key, or a file that is not ours)."""
    path = _cache_file()
    try:
        if path.stat().st_size > _MAX_CACHE_BYTES:
            return None
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("fingerprint") != key or not isinstance(stored.get("facts"), dict):
        return None
    return stored["facts"]


def store_adapter_facts(key: str, facts: dict[str, Any]) -> None:
    """Keep ``facts`` under ``key``; a store that cannot be written is left alone (the next run probes again)."""
    path = _cache_file()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"fingerprint": key, "facts": facts}))
        os.replace(tmp, path)  # readers see the old file or the new one, never half of one
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
