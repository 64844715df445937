"""Validated GGUF headers handed from a parent process to its isolated worker, as JSON.

The parent reads a local model's headers to describe it; the worker's backend reads the same
headers again to load it. Rather than parse them twice (tens of ms each for a 49k-token
vocabulary, on the worker's path to its first token), the parent sends the worker what its header
cache holds for the model (:func:`shared_headers`) and the worker puts it in its own cache
(:func:`adopt_shared_headers`). The facts travel as JSON; the long arrays' validated bytes travel
as they are, in one attachment after the frame (base64 and JSON would cost more than a parse).

Nothing is trusted that the file does not confirm: an adopted header is used only while the file
has the identity the worker itself sees (place, inode, size, times) *and* its header bytes hash to
the digest the parent computed over the very bytes it validated; :func:`read_gguf_header` checks
both on every use, as it does for a header it parsed itself, and parses anew when either differs.
No pickle: frames to a worker are JSON, whichever way they go (see ``_worker_protocol``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from anyformer.files._gguf_header import (
    _HEADER_CACHE,
    _HEADER_CACHE_SIZE,
    GGUFHeader,
    GGUFTensor,
    LazyArray,
    _file_identity,
)

#: Headers whose arrays take more than this are not sent: the worker parses them itself.
MAX_SHARED_BYTES = 32 * 1024 * 1024


def shared_headers(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], bytes]:
    """The cached headers of the GGUF file ``path``, or of the files under the folder ``path``.

    Returns JSON-ready entries and the attachment their long arrays point into (offset, length).
    """
    root = os.path.abspath(os.fspath(path))
    entries: list[dict[str, Any]] = []
    pieces: list[bytes] = []
    size = 0
    for identity, (header, digest) in list(_HEADER_CACHE.items()):
        file_path = identity[0]
        if file_path != root and not file_path.startswith(root.rstrip(os.sep) + os.sep):
            continue
        arrays = [value.shared_state()[0] for value in header.kv.values() if isinstance(value, LazyArray)]
        if size + sum(len(raw) for raw in arrays) > MAX_SHARED_BYTES:
            continue
        encoded = _encode_header(header, size)
        pieces.extend(arrays)
        size += sum(len(raw) for raw in arrays)
        entries.append({"path": file_path, "digest": digest.hex(), "header": encoded})
    return entries, b"".join(pieces)


def adopt_shared_headers(entries: Iterable[Mapping[str, Any]], attachment: bytes) -> int:
    """Put headers from :func:`shared_headers` in this process's header cache; returns how many.

    An entry whose file is gone is skipped; a malformed entry raises (it can only come from a
    broken parent). The cache checks the file's identity and header digest on every use.
    """
    adopted = 0
    for entry in entries:
        identity = _file_identity(Path(entry["path"]))
        if identity is None or identity[0] != entry["path"]:
            continue
        _HEADER_CACHE[identity] = (_decode_header(entry["header"], attachment), bytes.fromhex(entry["digest"]))
        adopted += 1
    while len(_HEADER_CACHE) > _HEADER_CACHE_SIZE:
        del _HEADER_CACHE[next(iter(_HEADER_CACHE))]
    return adopted


def _encode_header(header: GGUFHeader, offset: int) -> dict[str, Any]:
    """``header`` as JSON; each long array as ``{"lazy": [count, format, offset, length]}`` into the
    attachment, whose first ``offset`` bytes belong to the headers before."""
    kv: dict[str, Any] = {}
    for key, value in header.kv.items():
        if isinstance(value, LazyArray):
            raw, count, element_format = value.shared_state()
            kv[key] = {"lazy": [count, element_format, offset, len(raw)]}
            offset += len(raw)
        else:
            kv[key] = value  # str, int, float (NaN included: the frames allow it), bool, or a short list
    return {
        "version": header.version,
        "alignment": header.alignment,
        "kv": kv,
        "tensors": [[t.name, list(t.dims), t.ggml_type, t.offset, t.nbytes] for t in header.tensors],
        "data_offset": header.data_offset,
        "data_bytes": header.data_bytes,
        "file_size": header.file_size,
    }


def _decode_header(data: Mapping[str, Any], attachment: bytes) -> GGUFHeader:
    kv: dict[str, Any] = {}
    for key, value in data["kv"].items():
        if isinstance(value, dict):
            count, element_format, offset, length = value["lazy"]
            if offset < 0 or length < 0 or offset + length > len(attachment):
                raise ValueError(f"shared header array {key!r} lies outside the attachment")
            kv[key] = LazyArray(attachment[offset : offset + length], int(count), str(element_format))
        else:
            kv[key] = value
    return GGUFHeader(
        version=int(data["version"]),
        alignment=int(data["alignment"]),
        kv=kv,
        tensors=[
            GGUFTensor(name, tuple(dims), ggml_type, offset, nbytes)
            for name, dims, ggml_type, offset, nbytes in data["tensors"]
        ],
        data_offset=int(data["data_offset"]),
        data_bytes=int(data["data_bytes"]),
        file_size=int(data["file_size"]),
    )
