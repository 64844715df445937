"""A bounded, pure-Python reader and validator for safetensors headers from strangers (SAFETY.md T1).

The header is an 8-byte little-endian length and a JSON object. Python's json keeps the last of two
equal keys silently, while other readers keep the first, so one file could mean two models:
duplicate keys are refused anywhere in the JSON. The tensors must tile the data region exactly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from typing import Any, NamedTuple

from anyformer.files._byte_source import ByteSource, HeaderFault, read_header

__all__ = ["SAFETENSORS_DTYPE_BITS", "SafetensorsHeader", "SafetensorsTensor", "read_safetensors_header"]

#: Longest JSON header accepted; the safetensors library refuses more than 100 MB too.
MAX_HEADER_BYTES = 100 * 1024 * 1024

#: Bits per element of every safetensors dtype.
SAFETENSORS_DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}

_METADATA_KEY = "__metadata__"


class SafetensorsTensor(NamedTuple):
    """One tensor: dtype name, shape, and its byte range relative to the data start."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclasses.dataclass(frozen=True)
class SafetensorsHeader:
    """A validated safetensors header."""

    tensors: dict[str, SafetensorsTensor]
    #: The ``__metadata__`` strings, empty when absent.
    metadata: dict[str, str]
    #: Absolute file offset where tensor data starts (8 + the JSON header's length).
    data_offset: int
    file_size: int

    @property
    def parameter_count(self) -> int:
        """The number of elements in all tensors together."""
        total = 0
        for tensor in self.tensors.values():
            count = 1
            for dim in tensor.shape:
                count *= dim
            total += count
        return total


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise HeaderFault(f"duplicate JSON key {key!r} in the header")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise HeaderFault(f"the header holds {name}, which is not JSON")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor(name: str, entry: Any, data_len: int) -> SafetensorsTensor:
    label = f"tensor {name!r}"
    if not isinstance(entry, dict):
        raise HeaderFault(f"{label} is not a JSON object")
    for field in ("dtype", "shape", "data_offsets"):
        if field not in entry:
            raise HeaderFault(f"{label} has no {field}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPE_BITS:
        raise HeaderFault(f"{label} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise HeaderFault(f"{label} shape {shape!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
        raise HeaderFault(f"{label} data_offsets {offsets!r} is not [start, end]")
    start, end = offsets
    if not 0 <= start <= end:
        raise HeaderFault(f"{label} data_offsets [{start}, {end}] are not 0 <= start <= end")
    if end > data_len:
        raise HeaderFault(f"truncated: {label} ends at data byte {end}, the data region has {data_len} bytes")
    # The product is clamped just past what the data region can hold, so a long hostile shape never
    # builds a huge integer; a zero dim anywhere still makes the tensor empty.
    bits_per = SAFETENSORS_DTYPE_BITS[dtype]
    limit = data_len * 8 // bits_per + 1
    count = 1
    for dim in shape:
        count = min(count * dim, limit)
    if count == limit:
        raise HeaderFault(f"{label} of {dtype} {shape} needs more bytes than the {data_len}-byte data region holds")
    bits = count * bits_per
    if bits % 8:
        raise HeaderFault(f"{label} of {dtype} {shape} does not fill whole bytes")
    if end - start != bits // 8:
        raise HeaderFault(
            f"{label} of {dtype} {shape} needs {bits // 8} bytes but data_offsets [{start}, {end}] hold {end - start}"
        )
    return SafetensorsTensor(dtype, tuple(shape), start, end)


def _check_layout(tensors: dict[str, SafetensorsTensor], data_len: int) -> None:
    # The tensors must tile the data region exactly, as the safetensors library requires: a hole or
    # trailing bytes could hide a payload, an overlap gives two tensors one set of bytes.
    expected = 0
    prev_name: str | None = None
    for name, tensor in sorted(tensors.items(), key=lambda item: (item[1].start, item[1].end)):
        if tensor.start < expected:
            raise HeaderFault(f"tensor {name!r} at data byte {tensor.start} overlaps tensor {prev_name!r}")
        if tensor.start > expected:
            raise HeaderFault(
                f"hole of {tensor.start - expected} bytes before tensor {name!r} at data byte {tensor.start}"
            )
        expected = tensor.end
        prev_name = name
    if expected != data_len:
        raise HeaderFault(f"{data_len - expected} bytes of trailing data after the last tensor")


def _parse(source: ByteSource) -> SafetensorsHeader:
    size = int(source.size)
    if size < 8:
        raise HeaderFault(f"truncated: {size} bytes, not even the 8-byte header length")
    (header_len,) = struct.unpack("<Q", source.read_at(0, 8))
    if header_len > MAX_HEADER_BYTES:
        raise HeaderFault(f"header length {header_len} is over the {MAX_HEADER_BYTES} byte limit")
    if header_len > size - 8:
        raise HeaderFault(f"truncated: header length {header_len}, but only {size - 8} bytes follow")
    raw = source.read_at(8, header_len)
    if len(raw) != header_len:
        raise HeaderFault(f"truncated: header length {header_len}, the file ended after {len(raw)}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderFault(f"header is not valid UTF-8 (byte {exc.start})") from exc
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise HeaderFault(f"header is not valid JSON ({exc.msg} at char {exc.pos})") from exc
    except RecursionError as exc:
        raise HeaderFault("header JSON is nested too deeply") from exc
    if not isinstance(doc, dict):
        raise HeaderFault(f"header is a JSON {type(doc).__name__}, not an object")

    data_len = size - 8 - header_len
    metadata = doc.pop(_METADATA_KEY, None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise HeaderFault("__metadata__ is not an object of strings")
    tensors = {name: _tensor(name, entry, data_len) for name, entry in doc.items()}
    _check_layout(tensors, data_len)
    return SafetensorsHeader(tensors=tensors, metadata=metadata, data_offset=8 + header_len, file_size=size)


def read_safetensors_header(
    source: ByteSource | str | os.PathLike[str], *, name: str | None = None
) -> SafetensorsHeader:
    """Read and validate the header of a safetensors file.

    ``source`` is a path or any ByteSource (see :mod:`anyformer.files._gguf_header`); ``name`` labels the
    messages (default: the file name). Raises ``AnyformerError(BAD_MODEL)`` naming the file, the
    fault and the tensor; no other exception escapes.
    """
    return read_header(source, name, "safetensors", _parse)
