"""Validated GGUF headers handed from a parent process to its isolated worker, as JSON.

The parent reads a local model's headers to describe it; the worker's backend reads the same
headers again to load it. Rather than parse them twice (tens of ms each for a 49k-token
vocabulary, on the worker's path to its first token), the parent sends the worker what its header
cache holds for the model (:func:`shared_headers`) and the worker puts it in its own cache
(:func:`adopt_shared_headers`).

What travels is small: the facts as JSON, and for each long array only where its bytes lie in the
file. The worker reads the header's bytes from the file once, checks that they hash to the digest
the parent computed over the very bytes it validated, and takes the arrays from them; a file that
changed in between fails the check and is parsed anew when the backend asks. Sending the arrays
themselves through the pipe (~2 MB for SmolLM2) took longer than parsing on a busy machine.
The cache also checks the file's identity and digest on every later use, as for a header it
parsed itself. No pickle: frames to a worker are JSON, whichever way they go (``_worker_protocol``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from anyformer.files._byte_source import read_file_prefix
from anyformer.files._gguf_header import (
    _HEADER_CACHE,
    _HEADER_CACHE_SIZE,
    GGUFHeader,
    GGUFTensor,
    LazyArray,
    _file_identity,
)


def shared_headers(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The cached headers of the GGUF file ``path``, or of the files under the folder ``path``, as JSON-ready dicts."""
    root = os.path.abspath(os.fspath(path))
    entries: list[dict[str, Any]] = []
    for identity, (header, digest) in list(_HEADER_CACHE.items()):
        file_path = identity[0]
        if file_path != root and not file_path.startswith(root.rstrip(os.sep) + os.sep):
            continue
        encoded = _encode_header(header)
        if encoded is not None:
            entries.append({"path": file_path, "digest": digest.hex(), "header": encoded})
    return entries


def adopt_shared_headers(entries: Iterable[Mapping[str, Any]]) -> int:
    """Put headers from :func:`shared_headers` in this process's header cache; returns how many.

    An entry is skipped when its file is gone or its header bytes no longer hash to the entry's
    digest; a malformed entry raises (it can only come from a broken parent).
    """
    adopted = 0
    for entry in entries:
        identity = _file_identity(Path(entry["path"]))
        if identity is None or identity[0] != entry["path"]:
            continue
        data = entry["header"]
        length = int(data["data_offset"])
        digest = bytes.fromhex(entry["digest"])
        try:
            head = read_file_prefix(entry["path"], length)
        except OSError:
            continue
        if len(head) != length or hashlib.blake2b(head, digest_size=32).digest() != digest:
            continue  # changed since the parent read it: the backend's read parses it anew
        _HEADER_CACHE[identity] = (_decode_header(data, head), digest)
        adopted += 1
    while len(_HEADER_CACHE) > _HEADER_CACHE_SIZE:
        del _HEADER_CACHE[next(iter(_HEADER_CACHE))]
    return adopted


def _encode_header(header: GGUFHeader) -> dict[str, Any] | None:
    """``header`` as JSON, each long array as ``{"lazy": [count, format, offset, length]}`` in the file;
    None when an array's place in the file is not known."""
    kv: dict[str, Any] = {}
    for key, value in header.kv.items():
        if isinstance(value, LazyArray):
            offset, length, count, element_format = value.shared_state()
            if offset < 0:
                return None
            kv[key] = {"lazy": [count, element_format, offset, length]}
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


def _decode_header(data: Mapping[str, Any], head: bytes) -> GGUFHeader:
    """The header ``data`` describes, its long arrays taken from ``head`` (the file's header bytes)."""
    kv: dict[str, Any] = {}
    for key, value in data["kv"].items():
        if isinstance(value, dict):
            count, element_format, offset, length = value["lazy"]
            if offset < 0 or length < 0 or offset + length > len(head):
                raise ValueError(f"shared header array {key!r} lies outside the header")
            kv[key] = LazyArray(head[offset : offset + length], int(count), str(element_format), offset)
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
