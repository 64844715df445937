"""Split a test GGUF into a set of shards laid out as llama.cpp's ``gguf-split`` lays them out.

For tests (gguf-py reads the key-values' raw bytes; it is a test dependency, imported inside the
function). The first shard carries every key-value of the source, each shard ``split.no`` (u16,
0-based), ``split.count`` (u16) and ``split.tensors.count`` (i32), and its tensors' infos and data
(each aligned as the source's alignment says). Which shard a tensor goes to is the caller's choice,
so a test can put a layer's experts in another shard than its dense weights.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

from anyformer.plugin import read_gguf_header
from anyformer_gguf_gpu.split_set import shard_name

# gguf value types (gguf.h): the split keys' own.
_UINT16, _INT32 = 2, 5


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _kv(key: str, value_type: int, value: int) -> bytes:
    return _string(key) + struct.pack("<I", value_type) + struct.pack("<H" if value_type == _UINT16 else "<i", value)


def write_split_set(source: str, prefix: str, count: int, shard_of: Callable[[str], int]) -> list[str]:
    """Write ``source``'s tensors into ``count`` shards ``<prefix>-0000i-of-0000N.gguf`` (``shard_of(name)`` gives
    each tensor's 0-based shard); returns the shards' paths in order. Tensor order within a shard is the source's."""
    from gguf import GGUFReader

    header = read_gguf_header(source)
    reader = GGUFReader(source)
    # Each key-value's bytes as stored (key, type, value), so every type is kept exactly.
    source_kv = [
        b"".join(bytes(part.tobytes()) for part in field.parts)
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.")
    ]
    alignment = header.alignment
    paths = []
    with open(source, "rb") as data:
        for index in range(count):
            tensors = [t for t in header.tensors if shard_of(t.name) == index]
            kv = source_kv if index == 0 else []
            kv = [
                *kv,
                _kv("split.no", _UINT16, index),
                _kv("split.count", _UINT16, count),
                _kv("split.tensors.count", _INT32, len(header.tensors)),
            ]
            infos, blobs, offset = [], [], 0
            for t in tensors:
                dims = struct.pack(f"<{len(t.dims)}Q", *t.dims)
                kind = struct.pack("<IQ", t.ggml_type, offset)
                infos.append(_string(t.name) + struct.pack("<I", len(t.dims)) + dims + kind)
                data.seek(header.data_offset + t.offset)
                blob = data.read(t.nbytes)
                pad = -len(blob) % alignment
                blobs.append(blob + b"\0" * pad)
                offset += len(blob) + pad
            head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(kv) + b"".join(infos)
            path = shard_name(prefix, index + 1, count)
            with open(path, "wb") as out:
                out.write(head + b"\0" * (-len(head) % alignment))
                for blob in blobs:
                    out.write(blob)
            paths.append(os.fspath(path))
    return paths
