"""The installed backends' entry points, remembered between commands.

Finding them with ``importlib.metadata`` means importing it (with ``email``, ``zipfile``, ``csv``
and more: ~20 ms, the largest part of ``import anyformer``'s cost on a command's path) and reading
every installed distribution's metadata. What it finds changes only when a distribution is
installed, removed or rewritten, so the result is kept in ``ANYFORMER_HOME/probe/entry_points.json``
under a fingerprint of exactly that: the interpreter, ``sys.path``, and for each folder on it the
names of its ``*.dist-info``/``*.egg-info`` folders with the size, modification time and inode of
each one's ``entry_points.txt`` (or its absence). Installing or removing a plugin changes the names;
reinstalling one rewrites its ``entry_points.txt``; either way the next command scans again. The
fingerprint takes one ``stat`` per installed distribution (~1 ms for a hundred).

``ANYFORMER_PLUGIN_CACHE=0`` turns the cache off. A cache file that is not ours (not owned by this
user, writable by others, too large, or not what we write) is ignored: it names code to import.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from anyformer.store._paths import anyformer_home

#: A cache file larger than this is not ours (an entry takes ~100 bytes).
_MAX_CACHE_BYTES = 1 << 20
#: How many fingerprints (interpreters, virtual environments sharing ANYFORMER_HOME) are kept.
_MAX_KEYS = 8
#: ``module.path:attr.path``, optionally followed by ``[extras]``, as entry point values are written.
_VALUE = re.compile(r"^(?P<module>[\w.]+)\s*(?::\s*(?P<attr>[\w.]+))?\s*(?:\[.*\])?\s*$")


@dataclasses.dataclass(frozen=True)
class EntryPointRecord:
    """One entry point as the plugin host needs it: its name, ``module:attr`` value, and distribution."""

    name: str
    value: str
    group: str
    distribution: str | None = None
    version: str | None = None

    def load(self) -> Any:
        """Import the module and return the attribute the value names (the module itself without one)."""
        match = _VALUE.match(self.value)
        if match is None:
            raise ValueError(f"entry point value {self.value!r} is not module:attr")
        target: Any = importlib.import_module(match["module"])
        for attribute in (match["attr"] or "").split("."):
            if attribute:
                target = getattr(target, attribute)
        return target


def enabled() -> bool:
    """Whether the cache may be read and written (``ANYFORMER_PLUGIN_CACHE=0`` turns it off)."""
    return os.environ.get("ANYFORMER_PLUGIN_CACHE", "1") != "0"


def installed_entry_points(group: str) -> list[EntryPointRecord]:
    """The entry points of ``group`` that the installed distributions declare, from the cache when it holds them."""
    if not enabled():
        return scan(group)
    key = fingerprint(group)
    stored = _read()
    cached = _records(stored.get(key), group)
    if cached is not None:
        return cached
    found = scan(group)
    kept = {k: v for k, v in stored.items() if k != key}
    while len(kept) >= _MAX_KEYS:
        kept.pop(next(iter(kept)))
    kept[key] = [dataclasses.asdict(record) for record in found]
    _write(kept)
    return found


def scan(group: str) -> list[EntryPointRecord]:
    """Ask ``importlib.metadata`` for the entry points of ``group`` (no cache)."""
    import importlib.metadata

    records = []
    for entry_point in importlib.metadata.entry_points(group=group):
        dist = getattr(entry_point, "dist", None)
        records.append(
            EntryPointRecord(
                name=entry_point.name,
                value=entry_point.value,
                group=group,
                distribution=dist.name if dist is not None else None,
                version=dist.version if dist is not None else None,
            )
        )
    return records


def fingerprint(group: str) -> str:
    """A digest of what decides the installed entry points: the interpreter, ``sys.path`` and what is on it."""
    places: list[Any] = []
    for entry in sys.path:
        places.append([entry, _distributions_in(entry or ".")])
    parts = {"group": group, "python": sys.executable, "path": places}
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _distributions_in(place: str) -> Any:
    """Each distribution folder in ``place`` with its ``entry_points.txt``'s identity; a file's own identity."""
    try:
        entries = os.scandir(place)
    except NotADirectoryError:
        return _identity(place)  # a zip on sys.path
    except OSError:
        return None
    found = []
    with entries:
        for entry in entries:
            if entry.name.endswith((".dist-info", ".egg-info")):
                found.append([entry.name, _identity(os.path.join(entry.path, "entry_points.txt"))])
    found.sort()
    return found


def _identity(path: str) -> list[int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino]


def _cache_file() -> Path:
    return anyformer_home() / "probe" / "entry_points.json"


def _read() -> dict[str, Any]:
    path = _cache_file()
    try:
        stat = path.stat()
        if stat.st_size > _MAX_CACHE_BYTES or stat.st_mode & 0o022:
            return {}
        if hasattr(os, "getuid") and stat.st_uid != os.getuid():
            return {}
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def _records(rows: Any, group: str) -> list[EntryPointRecord] | None:
    """The records stored under one key, or None when they are missing or not what this module writes."""
    if not isinstance(rows, list):
        return None
    records = []
    for row in rows:
        if not isinstance(row, dict) or row.get("group") != group:
            return None
        try:
            record = EntryPointRecord(**row)
        except TypeError:
            return None
        fields = (record.name, record.value)
        if not all(isinstance(f, str) for f in fields) or not all(
            f is None or isinstance(f, str) for f in (record.distribution, record.version)
        ):
            return None
        records.append(record)
    return records


def _write(stored: dict[str, Any]) -> None:
    """Replace the cache file; one that cannot be written is left alone (the next command scans again)."""
    path = _cache_file()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump(stored, handle)
        os.replace(tmp, path)  # readers see the old file or the new one, never half of one
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
