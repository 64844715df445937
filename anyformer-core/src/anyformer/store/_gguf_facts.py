"""Header facts of any GGUF candidate of a description, on demand and bounded (:func:`gguf_facts`).

A backend asks for the candidate it would load. The answer comes from, in order: the description
(``metadata["gguf_files"]``, or ``metadata["gguf"]`` for ``metadata["gguf_file"]``), this process,
the per-commit cache under ``ANYFORMER_HOME/gguf-headers/<repo>/<commit>/`` (a commit's files never
change, so an entry never goes stale), the local file, or the Hub by range requests. At most
:data:`MAX_HUB_HEADER_READS` headers of one repo commit are read from the Hub per process, so a
repo of 30 quants never costs 30 reads however many backends and checks ask. A what-if description
has no files to read: None, and the backend estimates from names and sizes.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._model import Model
from anyformer.files._gguf_candidates import GGUFCandidate
from anyformer.store._paths import anyformer_home

#: Hub header reads per repo commit and process; later asks answer None (the estimate is rough).
MAX_HUB_HEADER_READS = 3

_COMMIT = re.compile(r"^[0-9a-f]{40}\Z")
_lock = threading.Lock()
_memory: dict[tuple[str, ...], dict[str, Any]] = {}
_hub_reads: dict[tuple[str, str], int] = {}


def gguf_facts(model: Model, candidate: GGUFCandidate) -> dict[str, Any] | None:
    """The header summary of ``candidate`` (the first shard's, data bytes of the whole set), or None.

    None means no header can be had here: a what-if description without it, the Hub offline and
    nothing cached, or this commit's read budget spent. A hostile header is ``BAD_MODEL``.
    """
    given = _from_description(model, candidate)
    if given is not None:
        return given
    first = candidate.first
    if first.path is not None:
        return _local(candidate)
    if model.source != "hub" or not isinstance(model.revision, str) or not _COMMIT.match(model.revision):
        return None
    key = ("hub", model.repo, model.revision, candidate.name)
    with _lock:
        if key in _memory:
            return _memory[key]
    cached = _read_cache(model.repo, model.revision, candidate.name)
    if cached is None:
        cached = _read_from_hub(model, candidate)
        if cached is None:
            return None
        _write_cache(model.repo, model.revision, candidate.name, cached)
    with _lock:
        _memory[key] = cached
    return cached


def _from_description(model: Model, candidate: GGUFCandidate) -> dict[str, Any] | None:
    """The summary the description carries for ``candidate``: per file, or ``gguf`` for ``gguf_file``
    (a description naming no ``gguf_file`` means its one candidate)."""
    per_file = model.metadata.get("gguf_files")
    if isinstance(per_file, dict) and isinstance(per_file.get(candidate.name), dict):
        return dict(per_file[candidate.name])
    summary = model.metadata.get("gguf")
    if not isinstance(summary, dict):
        return None
    named = model.metadata.get("gguf_file")
    if named == candidate.name:
        return dict(summary)
    if named is None:
        from anyformer.files._gguf_candidates import gguf_candidates

        if [c.name for c in gguf_candidates(model)] == [candidate.name]:
            return dict(summary)
    return None


def with_set_bytes(
    summary: dict[str, Any], candidate: GGUFCandidate, shards: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A first shard's summary made to describe its whole set.

    With every shard's summary (``shards``, a local set) their tensors are added up; with the first
    shard's alone (a Hub set: one range request, not one per shard) the other shards' file sizes
    stand in for their data, and ``tensor_bytes`` is scaled to the set's bytes (``set_estimated``).
    """
    if len(candidate.files) < 2:
        return summary
    out = dict(summary)
    out["set_files"] = len(candidate.files)
    if shards is not None and len(shards) == len(candidate.files):
        out["data_bytes"] = sum(_int(s.get("data_bytes")) for s in shards)
        out["tensor_count"] = sum(_int(s.get("tensor_count")) for s in shards)
        types: dict[str, int] = {}
        for shard in shards:
            for name, count in (shard.get("tensor_types") or {}).items():
                types[name] = types.get(name, 0) + _int(count)
        out["tensor_types"] = dict(sorted(types.items()))
        decode_bytes: dict[str, int] = {}
        for shard in shards:
            for name, nbytes in (shard.get("decode_bytes_by_type") or {}).items():
                decode_bytes[name] = decode_bytes.get(name, 0) + _int(nbytes)
        out["decode_bytes_by_type"] = dict(sorted(decode_bytes.items()))
        parts = [s.get("tensor_bytes") or {} for s in shards]
        out["tensor_bytes"] = {
            key: (max if key in ("experts_widest_layer", "expert_layers") else sum)(_int(p.get(key)) for p in parts)
            for key in parts[0]
        }
        return out
    first_data = _int(summary.get("data_bytes"))
    total = first_data + sum(f.size or 0 for f in candidate.files[1:])
    out["data_bytes"] = total
    facts = summary.get("tensor_bytes")
    if isinstance(facts, dict) and first_data:
        scale = total / first_data
        out["tensor_bytes"] = {
            key: _int(value) if key == "expert_layers" else int(_int(value) * scale) for key, value in facts.items()
        }
    by_type = summary.get("decode_bytes_by_type")
    if isinstance(by_type, dict) and first_data:
        scale = total / first_data
        out["decode_bytes_by_type"] = {key: int(_int(value) * scale) for key, value in by_type.items()}
    out["set_estimated"] = True
    return out


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _local(candidate: GGUFCandidate) -> dict[str, Any] | None:
    from anyformer.files._gguf_header import read_gguf_header

    path = candidate.first.path or ""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    key = ("local", path, str(stat.st_size), str(stat.st_mtime_ns))
    with _lock:
        if key in _memory:
            return _memory[key]
    shards = [read_gguf_header(f.path or "", name=f.name).summary() for f in candidate.files if f.path]
    summary = with_set_bytes(shards[0], candidate, shards)
    with _lock:
        _memory[key] = summary
    return summary


def _read_from_hub(model: Model, candidate: GGUFCandidate) -> dict[str, Any] | None:
    from anyformer.store._hub_bytes import HubByteSource
    from anyformer.store._hub_errors import is_offline

    if is_offline():
        return None
    budget_key = (model.repo, str(model.revision))
    with _lock:
        if _hub_reads.get(budget_key, 0) >= MAX_HUB_HEADER_READS:
            return None
        _hub_reads[budget_key] = _hub_reads.get(budget_key, 0) + 1
    from anyformer.files._gguf_header import read_gguf_header

    source = HubByteSource(model.repo, candidate.name, model.revision, size=candidate.first.size)
    try:
        header = read_gguf_header(source, name=candidate.name)
    except AnyformerError as exc:
        if exc.code is ErrorCode.OFFLINE:
            return None
        raise
    return with_set_bytes(header.summary(), candidate)


def _cache_path(repo: str, commit: str, name: str) -> Path:
    return anyformer_home() / "gguf-headers" / repo / commit / (name.replace("/", "%2F") + ".json")


def _read_cache(repo: str, commit: str, name: str) -> dict[str, Any] | None:
    try:
        data = json.loads(_cache_path(repo, commit, name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_cache(repo: str, commit: str, name: str, summary: dict[str, Any]) -> None:
    path = _cache_path(repo, commit, name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(summary, sort_keys=True), encoding="utf-8")
        os.replace(temporary, path)
    except OSError:
        pass  # a read-only home only costs a range request next time


def forget_gguf_facts() -> None:
    """Drop this process's cached summaries and read counts (tests; a long-lived server after a pull)."""
    with _lock:
        _memory.clear()
        _hub_reads.clear()
