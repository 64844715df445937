"""Handcrafted model files, written byte by byte so that any malformation can be made.

GGUF, safetensors and ONNX (protobuf) encoders with every field overridable. Nothing here uses the
gguf, safetensors or onnx packages: their writers refuse to write the faults these tests need.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Iterable, Sequence
from typing import Any

from anyformer.files._gguf_header import GGML_TYPES

# GGUF value type ids.
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FORMATS = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q", I64: "q", F64: "d"}

# ggml type ids used in the tests.
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0 = 0, 1, 2, 8


def u32(value: int) -> bytes:
    """A little-endian uint32."""
    return struct.pack("<I", value)


def i32(value: int) -> bytes:
    """A little-endian int32."""
    return struct.pack("<i", value)


def u64(value: int) -> bytes:
    """A little-endian uint64."""
    return struct.pack("<Q", value)


def gguf_str(text: str | bytes, *, length: int | None = None) -> bytes:
    """A GGUF string: uint64 length then the bytes; ``length`` overrides the length written."""
    raw = text.encode() if isinstance(text, str) else text
    return u64(len(raw) if length is None else length) + raw


def scalar(vtype: int, value: Any) -> bytes:
    """The encoding of one scalar value of GGUF type ``vtype`` (strings included)."""
    if vtype == STRING:
        return gguf_str(value)
    return struct.pack("<" + _FORMATS[vtype], value)


def kv(key: str | bytes, vtype: int, value: Any) -> bytes:
    """One metadata entry with a scalar or string value."""
    return gguf_str(key) + u32(vtype) + scalar(vtype, value)


def kv_raw(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    """One metadata entry whose value bytes are given as they are."""
    return gguf_str(key) + u32(vtype) + payload


def array_payload(etype: int, values: Sequence[Any], *, count: int | None = None) -> bytes:
    """The value bytes of an array (element type, count, elements); ``count`` overrides the count."""
    body = b"".join(scalar(etype, v) for v in values)
    return u32(etype) + u64(len(values) if count is None else count) + body


def kv_array(key: str, etype: int, values: Sequence[Any], *, count: int | None = None) -> bytes:
    """One metadata entry holding an array."""
    return kv_raw(key, ARRAY, array_payload(etype, values, count=count))


def nested_arrays(depth: int) -> bytes:
    """The value bytes of an array of arrays ``depth`` deep, the innermost empty."""
    payload = u32(U8) + u64(0)
    for _ in range(depth):
        payload = u32(ARRAY) + u64(1) + payload
    return payload


def tensor_nbytes(dims: Sequence[int], ggml_type: int) -> int:
    """The bytes a tensor of these dims and type takes (0 for an unknown type)."""
    if ggml_type not in GGML_TYPES:
        return 0
    block_size, type_size = GGML_TYPES[ggml_type].block_size, GGML_TYPES[ggml_type].type_size
    count = 1
    for dim in dims:
        count *= dim
    return count // block_size * type_size


@dataclasses.dataclass
class Tensor:
    """A tensor to write; ``offset`` None places it right after the previous one, aligned."""

    name: str | bytes
    dims: tuple[int, ...] = (8,)
    ggml_type: int = GGML_F32
    offset: int | None = None
    n_dims: int | None = None


def tensor_info(t: Tensor, offset: int) -> bytes:
    """One tensor info record."""
    n_dims = len(t.dims) if t.n_dims is None else t.n_dims
    return gguf_str(t.name) + u32(n_dims) + b"".join(u64(d) for d in t.dims) + i32(t.ggml_type) + u64(offset)


def make_gguf(
    tensors: Iterable[Tensor] = (),
    kvs: Iterable[bytes] = (),
    *,
    version: int = 3,
    magic: bytes = b"GGUF",
    alignment: int = 32,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    data_bytes: int | None = None,
) -> bytes:
    """A whole GGUF file. ``alignment`` is what the layout uses; a ``general.alignment`` key must be
    passed in ``kvs`` to change what the file says. ``data_bytes`` overrides how much data follows.
    """
    tensors = list(tensors)
    kvs = list(kvs)
    infos: list[bytes] = []
    end = 0
    for t in tensors:
        offset = end + (-end % alignment) if t.offset is None else t.offset
        infos.append(tensor_info(t, offset))
        end = max(end, offset + tensor_nbytes(t.dims, t.ggml_type))
    head = (
        magic
        + u32(version)
        + u64(len(tensors) if n_tensors is None else n_tensors)
        + u64(len(kvs) if n_kv is None else n_kv)
        + b"".join(kvs)
        + b"".join(infos)
    )
    head += b"\x00" * (-len(head) % alignment)
    size = end if data_bytes is None else data_bytes
    return head + (bytes(range(256)) * (size // 256 + 1))[:size]


def valid_gguf(**overrides: Any) -> bytes:
    """A small valid GGUF: an architecture, a few keys, a vocabulary and three tensors."""
    kvs = [
        kv("general.architecture", STRING, "llama"),
        kv("general.name", STRING, "tiny"),
        kv("llama.block_count", U32, 2),
        kv("llama.context_length", U32, 256),
        kv_array("tokenizer.ggml.tokens", STRING, ["<s>", "</s>", "a", "b"]),
        kv_array("tokenizer.ggml.scores", F32, [0.0, 0.0, -1.0, -2.0]),
    ]
    tensors = [
        Tensor("token_embd.weight", (32, 4), GGML_Q8_0),
        Tensor("blk.0.attn_q.weight", (8, 8), GGML_F16),
        Tensor("output_norm.weight", (8,), GGML_F32),
    ]
    args: dict[str, Any] = {"tensors": tensors, "kvs": kvs}
    args.update(overrides)
    return make_gguf(**args)


def split_shard(
    index: int,
    count: int,
    tensor_names: Sequence[str],
    total_tensors: int,
    *,
    split_no: int | None = None,
    split_count: int | None = None,
) -> bytes:
    """One shard of a split set as llama.cpp's gguf-split writes it (``split.no`` is 0-based)."""
    kvs = [
        kv("general.architecture", STRING, "llama"),
        kv("split.no", U16, index - 1 if split_no is None else split_no),
        kv("split.count", U16, count if split_count is None else split_count),
        kv("split.tensors.count", I32, total_tensors),
    ]
    return make_gguf([Tensor(n) for n in tensor_names], kvs)


def make_safetensors(
    header: dict[str, Any] | str | bytes, data: bytes = b"", *, header_len: int | None = None
) -> bytes:
    """A safetensors file: the header as a dict (dumped), str or raw bytes, then ``data``."""
    if isinstance(header, dict):
        raw = json.dumps(header).encode()
    elif isinstance(header, str):
        raw = header.encode()
    else:
        raw = header
    return u64(len(raw) if header_len is None else header_len) + raw + data


# Protobuf wire encoding, enough to hand-write ONNX models.


def varint(value: int) -> bytes:
    """A protobuf varint (negative values as 10-byte two's complement, as protobuf writes int64)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def pb_varint(field: int, value: int) -> bytes:
    """A varint field."""
    return varint(field << 3) + varint(value)


def pb_bytes(field: int, payload: bytes | str) -> bytes:
    """A length-delimited field (bytes, string or sub-message)."""
    raw = payload.encode() if isinstance(payload, str) else payload
    return varint(field << 3 | 2) + varint(len(raw)) + raw


def onnx_entry(key: str, value: str) -> bytes:
    """A StringStringEntryProto."""
    return pb_bytes(1, key) + pb_bytes(2, value)


def onnx_tensor(
    name: str,
    *,
    location: str | None = None,
    offset: int | None = None,
    length: int | None = None,
    raw_data: bytes | None = None,
    external: bool = True,
) -> bytes:
    """A TensorProto of 4 floats, inline (``raw_data``) or with external data at ``location``."""
    out = pb_varint(1, 4) + pb_varint(2, 1) + pb_bytes(8, name)
    if raw_data is not None:
        out += pb_bytes(9, raw_data)
    if location is not None:
        out += pb_bytes(13, onnx_entry("location", location))
        if offset is not None:
            out += pb_bytes(13, onnx_entry("offset", str(offset)))
        if length is not None:
            out += pb_bytes(13, onnx_entry("length", str(length)))
        if external:
            out += pb_varint(14, 1)
    return out


def onnx_graph(initializers: Sequence[bytes] = (), nodes: Sequence[bytes] = ()) -> bytes:
    """A GraphProto with nodes (field 1), initializers (field 5) and a name."""
    return b"".join(pb_bytes(1, n) for n in nodes) + pb_bytes(2, "g") + b"".join(pb_bytes(5, t) for t in initializers)


def onnx_node_with_tensor(tensor: bytes) -> bytes:
    """A Constant NodeProto whose attribute ``value`` (field 5) holds ``tensor`` in AttributeProto.t."""
    attribute = pb_bytes(1, "value") + pb_varint(20, 4) + pb_bytes(5, tensor)
    return pb_bytes(2, "out") + pb_bytes(4, "Constant") + pb_bytes(5, attribute)


def onnx_node_with_graph(graph: bytes) -> bytes:
    """An If-like NodeProto whose attribute holds ``graph`` in AttributeProto.g."""
    attribute = pb_bytes(1, "then_branch") + pb_varint(20, 5) + pb_bytes(6, graph)
    return pb_bytes(4, "If") + pb_bytes(5, attribute)


def onnx_model(
    graph: bytes | None = None,
    *,
    ir_version: int | None = 8,
    producer: str = "hostile-files",
    opsets: Sequence[tuple[str, int]] = (("", 17),),
    metadata: Sequence[tuple[str, str]] = (),
) -> bytes:
    """A ModelProto."""
    out = b""
    if ir_version is not None:
        out += pb_varint(1, ir_version)
    out += pb_bytes(2, producer)
    for domain, version in opsets:
        out += pb_bytes(8, pb_bytes(1, domain) + pb_varint(2, version))
    if graph is not None:
        out += pb_bytes(7, graph)
    for key, value in metadata:
        out += pb_bytes(14, onnx_entry(key, value))
    return out


def nested_onnx_graphs(depth: int) -> bytes:
    """A ModelProto whose graph nests ``depth`` If-nodes deep, with an external tensor at the bottom."""
    graph = onnx_graph([onnx_tensor("w", location="w.bin")])
    for _ in range(depth):
        graph = onnx_graph(nodes=[onnx_node_with_graph(graph)])
    return onnx_model(graph)
