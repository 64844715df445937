"""A bounded, pure-Python reader and validator for GGUF headers from strangers (SAFETY.md G1-G15, S1).

Every length, count, offset and size is checked with exact Python integers against hard caps and
against the bytes the file really has, before anything is allocated or iterated. The gguf package and
ggml's C loader are not validators (SAFETY.md), so the core runs this reader first on every GGUF.
Only the standard library is imported here: this module runs on every ``describe``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.files._byte_source import (
    BytesByteSource,
    ByteSource,
    FileByteSource,
    HeaderFault,
    read_file_prefix,
    read_header,
)
from anyformer.files._gguf_arrays import ASCII_PREFIX_LIMIT, LazyArray, has_invalid_utf8

__all__ = [
    "GGML_TYPES",
    "SPLIT_RE",
    "ByteSource",
    "BytesByteSource",
    "FileByteSource",
    "GGMLType",
    "GGUFHeader",
    "GGUFTensor",
    "LazyArray",
    "check_split_set",
    "read_gguf_header",
    "split_set_members",
]

#: Longest key or string value accepted. llama.cpp has no cap; 16 MiB holds any real chat template.
MAX_STRING_BYTES = 16 * 1024 * 1024
#: Most elements accepted in one array; the largest real vocabularies hold a few hundred thousand.
MAX_ARRAY_ELEMENTS = 64 * 1024 * 1024
#: Most array elements in one header, all arrays together: keeps the Python objects a hostile
#: header can make us build to a few hundred MB at worst (real vocabularies: under 1 Mi per array).
MAX_TOTAL_ARRAY_ELEMENTS = 8 * 1024 * 1024
#: Most bytes one tensor may claim: far above any real model, far below where int64 math wraps.
MAX_TENSOR_BYTES = 1 << 50
#: Arrays longer than this are kept as validated bytes and decoded on first use (:class:`LazyArray`):
#: a description needs a vocabulary's length, not its strings.
LAZY_ARRAY_ELEMENTS = 256
#: Largest ``general.alignment`` accepted.
MAX_ALIGNMENT = 1 << 16
#: ggml's GGML_MAX_DIMS.
MAX_DIMS = 4
#: ggml's GGML_MAX_NAME counts the NUL, so a tensor name has at most 63 bytes.
MAX_TENSOR_NAME_BYTES = 63
#: GGUF's default alignment when ``general.alignment`` is absent.
DEFAULT_ALIGNMENT = 32

# A remote source pays per request, so the header is read in blocks this large.
_BLOCK = 1024 * 1024

_MAGIC = b"GGUF"

# Smallest encodings, used to bound counts by the bytes left before iterating anything.
# A key/value pair: key length (8) + a one-byte key + value type (4) + a one-byte value.
_MIN_KV_BYTES = 8 + 1 + 4 + 1
# A tensor info: name length (8) + a one-byte name + n_dims (4) + ggml type (4) + offset (8).
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 4 + 8

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")

# GGUF value types: id -> (name, struct format of one element, bytes of one element).
# The string entry gives the size of its length prefix, the least a string element can take.
_T_STRING = 8
_T_ARRAY = 9
_T_UINT32 = 4
_VALUE_TYPES: dict[int, tuple[str, str, int]] = {
    0: ("uint8", "B", 1),
    1: ("int8", "b", 1),
    2: ("uint16", "H", 2),
    3: ("int16", "h", 2),
    4: ("uint32", "I", 4),
    5: ("int32", "i", 4),
    6: ("float32", "f", 4),
    7: ("bool", "?", 1),
    8: ("string", "", 8),
    10: ("uint64", "Q", 8),
    11: ("int64", "q", 8),
    12: ("float64", "d", 8),
}
_SCALAR_STRUCTS = {tid: struct.Struct("<" + fmt) for tid, (_, fmt, _) in _VALUE_TYPES.items() if fmt}


class GGMLType(NamedTuple):
    """A ggml tensor type: its name, the elements in one block and the bytes one block takes."""

    name: str
    block_size: int
    type_size: int


#: Every ggml tensor type that exists, by id. Facts from gguf-py's ``GGML_QUANT_SIZES`` (gguf 0.19),
#: hardcoded so that describing a model never imports gguf.
GGML_TYPES: dict[int, GGMLType] = {
    0: GGMLType("F32", 1, 4),
    1: GGMLType("F16", 1, 2),
    2: GGMLType("Q4_0", 32, 18),
    3: GGMLType("Q4_1", 32, 20),
    6: GGMLType("Q5_0", 32, 22),
    7: GGMLType("Q5_1", 32, 24),
    8: GGMLType("Q8_0", 32, 34),
    9: GGMLType("Q8_1", 32, 40),
    10: GGMLType("Q2_K", 256, 84),
    11: GGMLType("Q3_K", 256, 110),
    12: GGMLType("Q4_K", 256, 144),
    13: GGMLType("Q5_K", 256, 176),
    14: GGMLType("Q6_K", 256, 210),
    15: GGMLType("Q8_K", 256, 292),
    16: GGMLType("IQ2_XXS", 256, 66),
    17: GGMLType("IQ2_XS", 256, 74),
    18: GGMLType("IQ3_XXS", 256, 98),
    19: GGMLType("IQ1_S", 256, 50),
    20: GGMLType("IQ4_NL", 32, 18),
    21: GGMLType("IQ3_S", 256, 110),
    22: GGMLType("IQ2_S", 256, 82),
    23: GGMLType("IQ4_XS", 256, 136),
    24: GGMLType("I8", 1, 1),
    25: GGMLType("I16", 1, 2),
    26: GGMLType("I32", 1, 4),
    27: GGMLType("I64", 1, 8),
    28: GGMLType("F64", 1, 8),
    29: GGMLType("IQ1_M", 256, 56),
    30: GGMLType("BF16", 1, 2),
    34: GGMLType("TQ1_0", 256, 54),
    35: GGMLType("TQ2_0", 256, 66),
    39: GGMLType("MXFP4", 32, 17),
    40: GGMLType("NVFP4", 64, 36),
    41: GGMLType("Q1_0", 128, 18),
}

# Ids ggml once had and removed; named in the message so that a user knows the file is just old.
_REMOVED_GGML_TYPES = {
    4: "Q4_2",
    5: "Q4_3",
    31: "Q4_0_4_4",
    32: "Q4_0_4_8",
    33: "Q4_0_8_8",
    36: "IQ4_NL_4_4",
    37: "IQ4_NL_4_8",
    38: "IQ4_NL_8_8",
}

#: A shard of a split set: ``<base>-00001-of-00003.gguf`` (groups: index, count).
SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")

_SPLIT_NO = "split.no"
_SPLIT_COUNT = "split.count"
_SPLIT_TENSORS = "split.tensors.count"

# A layer's tensor (``blk.7.ffn_up_exps.weight``) and the routed experts' tensors among them (llama.cpp's names).
_BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.(.+)$")
_EXPERT_TENSOR = re.compile(r"^ffn_(gate|up|down|gate_up)_exps\.weight$")
# Summary values longer than this are left out: vocabularies do not belong in a model description.
_SUMMARY_MAX_LIST = 256


@dataclasses.dataclass(frozen=True)
class GGUFTensor:
    """One tensor info: name, dims as stored (innermost first), ggml type, offset into the data, size."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    #: Bytes from the aligned start of the tensor data (:attr:`GGUFHeader.data_offset`).
    offset: int
    nbytes: int

    @property
    def n_elements(self) -> int:
        """The number of elements (1 for a tensor with no dims)."""
        count = 1
        for dim in self.dims:
            count *= dim
        return count

    @property
    def type_name(self) -> str:
        """The ggml type's name, e.g. ``Q4_K``."""
        return GGML_TYPES[self.ggml_type].name


@dataclasses.dataclass(frozen=True)
class GGUFHeader:
    """A validated GGUF header: metadata, tensor infos and where the tensor data lies."""

    version: int
    alignment: int
    #: Metadata by key; arrays are lists, or :class:`LazyArray` when longer than ``LAZY_ARRAY_ELEMENTS``
    #: (:meth:`get` returns those as lists).
    kv: dict[str, Any]
    tensors: list[GGUFTensor]
    #: Absolute file offset of the aligned start of the tensor data.
    data_offset: int
    #: Bytes the tensors span from ``data_offset`` (the end of the last tensor).
    data_bytes: int
    file_size: int

    @property
    def architecture(self) -> str | None:
        """``general.architecture``, or None when absent or not a string."""
        arch = self.kv.get("general.architecture")
        return arch if isinstance(arch, str) else None

    @property
    def file_type(self) -> int | None:
        """``general.file_type`` (llama.cpp's ``llama_ftype``), or None."""
        value = self.kv.get("general.file_type")
        return value if _is_int(value) else None

    @property
    def parameter_count(self) -> int:
        """The number of elements in all tensors together."""
        return sum(t.n_elements for t in self.tensors)

    def get(self, key: str, default: Any = None) -> Any:
        """The metadata value under ``key`` (a long array decoded into a list), or ``default``."""
        value = self.kv.get(key, default)
        return value.to_list() if isinstance(value, LazyArray) else value

    def arch_value(self, suffix: str, default: Any = None) -> Any:
        """The value of ``<architecture>.<suffix>``, e.g. ``arch_value("block_count")``, or ``default``."""
        arch = self.architecture
        if arch is None:
            return default
        return self.get(f"{arch}.{suffix}", default)

    def summary(self) -> dict[str, Any]:
        """The facts a model description needs, JSON-ready; long arrays are left out."""
        tokens = self.kv.get("tokenizer.ggml.tokens")
        split = None
        if _SPLIT_COUNT in self.kv:
            split = {
                "no": _small(self.kv.get(_SPLIT_NO)),
                "count": _small(self.kv.get(_SPLIT_COUNT)),
                "tensors_count": _small(self.kv.get(_SPLIT_TENSORS)),
            }
        return {
            "architecture": self.architecture,
            "name": _small(self.kv.get("general.name")),
            "block_count": _small(self.arch_value("block_count")),
            "context_length": _small(self.arch_value("context_length")),
            "embedding_length": _small(self.arch_value("embedding_length")),
            "feed_forward_length": _small(self.arch_value("feed_forward_length")),
            "head_count": _small(self.arch_value("attention.head_count")),
            "head_count_kv": _small(self.arch_value("attention.head_count_kv")),
            "key_length": _small(self.arch_value("attention.key_length")),
            "value_length": _small(self.arch_value("attention.value_length")),
            "expert_count": _small(self.arch_value("expert_count")),
            "expert_used_count": _small(self.arch_value("expert_used_count")),
            "file_type": self.file_type,
            "vocab_size": len(tokens) if isinstance(tokens, (list, LazyArray)) else None,
            "tensor_count": len(self.tensors),
            # Which ggml types the weights use (e.g. {"Q4_1": 210, "F32": 61}): a backend whose kernels
            # read only some types decides from this without opening the file.
            "tensor_types": dict(sorted(Counter(t.type_name for t in self.tensors).items())),
            "tokenizer_model": _small_str(self.kv.get("tokenizer.ggml.model")),
            "tokenizer_pre": _small_str(self.kv.get("tokenizer.ggml.pre")),
            "rope_scaling": _small_str(self.arch_value("rope.scaling.type")),
            "parameter_count": self.parameter_count,
            "data_bytes": self.data_bytes,
            "has_chat_template": isinstance(self.kv.get("tokenizer.chat_template"), str),
            "split": split,
            "tensor_bytes": self.tensor_bytes(),
            "decode_bytes_by_type": self.decode_bytes_by_type(),
        }

    def decode_bytes_by_type(self) -> dict[str, int]:
        """Bytes of the matrices one decode token reads, by ggml type (e.g. ``{"Q4_1": 66e6, "Q8_0": 28e6}``).

        Every tensor of two or more dimensions, except the token embedding where an ``output.weight``
        head exists (a token then reads one row of it; without a head the embedding is the head and is
        read whole). Routed experts count whole: a backend that runs only some scales by its own share.
        A backend models its decode speed from this without opening the file.
        """
        has_head = any(t.name == "output.weight" for t in self.tensors)
        out: dict[str, int] = {}
        for t in self.tensors:
            if len(t.dims) < 2 or (has_head and t.name == "token_embd.weight"):
                continue
            out[t.type_name] = out.get(t.type_name, 0) + t.nbytes
        return dict(sorted(out.items()))

    def tensor_bytes(self) -> dict[str, int]:
        """Where the tensor bytes lie, for a backend that places experts and dense weights apart.

        ``experts``: the routed experts' tensors (``blk.N.ffn_{gate,up,down,gate_up}_exps``),
        ``experts_widest_layer``: the most one layer's take, ``expert_layers``: layers that have them,
        ``dense``: every other tensor, of which ``dense_vectors`` (1-D tensors, ``dense_vector_elements``
        elements). Layers of multi-token prediction (``nextn_predict_layers``, never run) are left out.
        """
        layers = self.arch_value("block_count")
        nextn = self.arch_value("nextn_predict_layers", 0)
        run = layers - nextn if _is_int(layers) and _is_int(nextn) and 0 < nextn < layers else None
        experts = dense = vectors = vector_elements = 0
        per_layer: dict[int, int] = {}
        for t in self.tensors:
            match = _BLOCK_TENSOR.match(t.name)
            layer = int(match.group(1)) if match else -1
            if run is not None and layer >= run:
                continue
            if match and _EXPERT_TENSOR.match(match.group(2)):
                experts += t.nbytes
                per_layer[layer] = per_layer.get(layer, 0) + t.nbytes
            else:
                dense += t.nbytes
                if len(t.dims) == 1:
                    vectors += t.nbytes
                    vector_elements += t.n_elements
        return {
            "experts": experts,
            "experts_widest_layer": max(per_layer.values(), default=0),
            "expert_layers": len(per_layer),
            "dense": dense,
            "dense_vectors": vectors,
            "dense_vector_elements": vector_elements,
        }


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _small_str(value: Any) -> str | None:
    return value if isinstance(value, str) and len(value) <= 64 else None


def _small(value: Any) -> Any:
    if isinstance(value, LazyArray):
        return None  # longer than any list a summary keeps
    if isinstance(value, list):
        return value if len(value) <= _SUMMARY_MAX_LIST else None
    if isinstance(value, float) and not math.isfinite(value):
        return None  # NaN and infinities are not JSON
    return value


class _Cursor:
    """Sequential reads over a ByteSource through one buffer of at least ``_BLOCK`` bytes."""

    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self.size = int(source.size)
        self.pos = 0
        self.buf = b""
        self.buf_start = 0
        self.array_elements = 0

    def left(self) -> int:
        return self.size - self.pos

    def fill(self, need: int, what: str) -> int:
        """Make the buffer hold ``need`` bytes from ``pos``; return ``pos``'s index in it."""
        off = self.pos - self.buf_start
        if 0 <= off and off + need <= len(self.buf):
            return off
        if need > self.size - self.pos:
            raise HeaderFault(f"truncated: {what} needs {need} bytes at offset {self.pos}, {self.left()} left")
        want = min(max(need, _BLOCK), self.size - self.pos)
        data = self.source.read_at(self.pos, want)
        if len(data) < need:
            raise HeaderFault(f"truncated: {what} needs {need} bytes at offset {self.pos}, the file ended")
        self.buf = bytes(data)
        self.buf_start = self.pos
        return 0

    def take(self, n: int, what: str) -> bytes:
        off = self.fill(n, what)
        self.pos += n
        return self.buf[off : off + n]

    def unpack(self, st: struct.Struct, what: str) -> Any:
        off = self.fill(st.size, what)
        self.pos += st.size
        return st.unpack_from(self.buf, off)[0]

    def string(self, what: str) -> str:
        """A length-prefixed UTF-8 string, capped and checked against the bytes left first."""
        n = self.unpack(_U64, what)
        self.check_string_length(n, what)
        return _decode(self.take(n, what), what)

    def check_string_length(self, n: int, what: str) -> None:
        if n > MAX_STRING_BYTES:
            raise HeaderFault(f"{what} length {n} is over the {MAX_STRING_BYTES} byte limit")
        if n > self.left():
            raise HeaderFault(f"truncated: {what} length {n} at offset {self.pos} but only {self.left()} bytes left")

    def string_array_bytes(self, count: int, what: str) -> LazyArray:
        """``count`` strings kept as bytes: every length checked, UTF-8 checked in bulk, nothing decoded.

        The hot loop of a vocabulary, so it only walks the length prefixes, in a tight loop per
        buffer (:meth:`_walk_fast`); a file that breaks a bound is walked again element by
        element, for a message that names the element, and so is an array with a UTF-8 fault.
        """
        start = self.pos
        walked = self._walk_fast(count, what)
        if walked is None:
            raw, long_prefixes = self._walk_element_by_element(count, what)
        else:
            raw, long_prefixes = walked
        if has_invalid_utf8(raw, long_prefixes):
            self.pos = start
            self.string_array(count, what)  # raises, naming the element
        self.pos = start + len(raw)
        return LazyArray(raw, count, "", start)

    def _walk_fast(self, count: int, what: str) -> tuple[bytes, list[int]] | None:
        """The array's bytes and its long elements' prefixes, walked in a tight loop through each
        buffer it spans; None, with ``pos`` unchanged, when an element breaks a bound or runs past
        the file: the element-by-element walk then names it.

        Every bound still holds: an element of :data:`ASCII_PREFIX_LIMIT` bytes or more is checked
        against :data:`MAX_STRING_BYTES` here, and every byte kept was read from the file.
        """
        start = pos = self.pos
        size = self.size
        unpack_len = _U64.unpack_from
        limit = ASCII_PREFIX_LIMIT
        parts: list[bytes] = []
        long_prefixes: list[int] = []
        index = 0
        while index < count:
            if size - pos < 8:
                self.pos = start
                return None
            self.pos = pos
            off = self.fill(8, what)
            buf, base = self.buf, self.buf_start
            at = off  # the next length prefix's index in ``buf``
            reached = index
            try:
                for reached in range(index, count):  # noqa: B007  (where it stopped is read below)
                    (n,) = unpack_len(buf, at)
                    if n >= limit:
                        if n > MAX_STRING_BYTES:
                            self.pos = start
                            return None
                        long_prefixes.append(base + at - start)
                    at += 8 + n
                reached = count
            except struct.error:  # this length prefix is not wholly in the buffer
                pass
            index = reached
            end = len(buf)
            pos = base + at
            if at <= end:
                parts.append(buf[off:at])
                continue
            # The last element walked runs past the buffer: keep what it has, read the rest.
            if pos > size:
                self.pos = start
                return None
            parts.append(buf[off:end])
            self.pos = base + end
            rest = self.fill(at - end, what)
            parts.append(self.buf[rest : rest + at - end])
        self.pos = start
        return b"".join(parts), long_prefixes

    def _walk_element_by_element(self, count: int, what: str) -> tuple[bytes, list[int]]:
        """The element-by-element walk of :meth:`string_array_bytes`: refills the buffer as it goes and
        names the element whose length breaks a bound."""
        start = self.pos
        parts: list[bytes] = []
        long_prefixes: list[int] = []
        unpack_len = _U64.unpack_from
        size = self.size
        buf, base = self.buf, self.buf_start
        pos = self.pos
        piece = pos - base  # where the bytes not yet kept begin in ``buf``
        limit = ASCII_PREFIX_LIMIT
        for index in range(count):
            off = pos - base
            if off < 0 or off + 8 > len(buf):
                parts.append(buf[piece:off])
                self.pos = pos
                self.fill(8, what)
                buf, base = self.buf, self.buf_start
                off = piece = pos - base
            n = unpack_len(buf, off)[0]
            if n >= limit or n > size - pos - 8:
                self.pos = pos + 8
                self.check_string_length(n, f"{what} element {index}")  # raises when over a bound
                long_prefixes.append(pos - start)
            pos += 8 + n
            if off + 8 + n > len(buf):
                parts.append(buf[piece : off + 8])
                self.pos = pos - n
                self.fill(n, what)
                buf, base = self.buf, self.buf_start
                piece = pos - n - base
        parts.append(buf[piece : pos - base])
        self.pos = start
        return b"".join(parts), long_prefixes

    def string_array(self, count: int, what: str) -> list[str]:
        """``count`` strings; the hot loop of a vocabulary, so it keeps the buffer in locals."""
        out: list[str] = []
        append = out.append
        unpack_len = _U64.unpack_from
        size = self.size
        buf, base = self.buf, self.buf_start
        pos = self.pos
        for index in range(count):
            off = pos - base
            if off < 0 or off + 8 > len(buf):
                self.pos = pos
                self.fill(8, what)
                buf, base, off = self.buf, self.buf_start, pos - self.buf_start
            n = unpack_len(buf, off)[0]
            pos += 8
            off += 8
            if n > MAX_STRING_BYTES or n > size - pos:
                self.pos = pos
                self.check_string_length(n, f"{what} element {index}")
            if off + n > len(buf):
                self.pos = pos
                self.fill(n, what)
                buf, base, off = self.buf, self.buf_start, 0
            try:
                append(buf[off : off + n].decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise HeaderFault(f"{what} element {index} is not valid UTF-8 (byte {exc.start})") from exc
            pos += n
        self.pos = pos
        return out


def _decode(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderFault(f"{what} is not valid UTF-8 (byte {exc.start} of {len(raw)})") from exc


def _read_value(cur: _Cursor, vtype: int, key: str) -> Any:
    if vtype == _T_ARRAY:
        return _read_array(cur, key)
    if vtype == _T_STRING:
        return cur.string(f"string value of key {key!r}")
    st = _SCALAR_STRUCTS.get(vtype)
    if st is None:
        raise HeaderFault(f"key {key!r} has unknown value type {vtype}")
    return cur.unpack(st, f"value of key {key!r}")


def _read_array(cur: _Cursor, key: str) -> list[Any] | LazyArray:
    etype = cur.unpack(_U32, f"array type of key {key!r}")
    if etype == _T_ARRAY:
        # Refused outright: no real model nests arrays, and gguf-py recurses on them without bound.
        raise HeaderFault(f"key {key!r} is an array of arrays, which is not supported")
    if etype not in _VALUE_TYPES:
        raise HeaderFault(f"key {key!r} is an array of unknown value type {etype}")
    count = cur.unpack(_U64, f"array length of key {key!r}")
    if count > MAX_ARRAY_ELEMENTS:
        raise HeaderFault(f"array {key!r} has {count} elements, over the limit of {MAX_ARRAY_ELEMENTS}")
    cur.array_elements += count
    if cur.array_elements > MAX_TOTAL_ARRAY_ELEMENTS:
        raise HeaderFault(
            f"array {key!r} brings the header's arrays to {cur.array_elements} elements, "
            f"over the limit of {MAX_TOTAL_ARRAY_ELEMENTS}"
        )
    _, fmt, elem_size = _VALUE_TYPES[etype]
    # Checked before one element is read: a claimed 2^62 elements fails here, in O(1).
    if count * elem_size > cur.left():
        raise HeaderFault(
            f"truncated: array {key!r} of {count} elements needs at least {count * elem_size} bytes, {cur.left()} left"
        )
    lazy = count > LAZY_ARRAY_ELEMENTS
    if etype == _T_STRING:
        if lazy:
            return cur.string_array_bytes(count, f"array {key!r}")
        return cur.string_array(count, f"array {key!r}")
    start = cur.pos
    raw = cur.take(count * elem_size, f"array {key!r}")
    if lazy:
        return LazyArray(raw, count, fmt, start)
    return list(struct.unpack_from(f"<{count}{fmt}", raw))


def _check_alignment(value: Any, vtype: int) -> int:
    if vtype != _T_UINT32:
        type_name = "array" if vtype == _T_ARRAY else _VALUE_TYPES.get(vtype, (str(vtype),))[0]
        raise HeaderFault(f"general.alignment must be a uint32, not {type_name}")
    if value < 1 or value > MAX_ALIGNMENT or value & (value - 1):
        raise HeaderFault(f"general.alignment {value} is not a power of two between 1 and {MAX_ALIGNMENT}")
    return int(value)


def _read_tensor_info(cur: _Cursor, index: int) -> tuple[str, tuple[int, ...], int, int, int]:
    where = f"tensor {index}"
    name_len = cur.unpack(_U64, f"{where} name length")
    cur.check_string_length(name_len, f"{where} name")
    name = _decode(cur.take(name_len, f"{where} name"), f"{where} name")
    if not name:
        raise HeaderFault(f"{where} has an empty name")
    if name_len > MAX_TENSOR_NAME_BYTES:
        raise HeaderFault(f"tensor {name!r} name is {name_len} bytes, over ggml's limit of {MAX_TENSOR_NAME_BYTES}")
    label = f"tensor {name!r}"
    n_dims = cur.unpack(_U32, f"{label} n_dims")
    if n_dims > MAX_DIMS:
        raise HeaderFault(f"{label} has {n_dims} dims, at most {MAX_DIMS} are allowed")
    dims = tuple(cur.unpack(_U64, f"{label} dims") for _ in range(n_dims))
    ggml_type = cur.unpack(_I32, f"{label} type")
    offset = cur.unpack(_U64, f"{label} offset")
    info = GGML_TYPES.get(ggml_type)
    if info is None:
        removed = _REMOVED_GGML_TYPES.get(ggml_type)
        detail = f" ({removed}, removed from ggml)" if removed else ""
        raise HeaderFault(f"{label} has unknown ggml type {ggml_type}{detail}")
    if dims and dims[0] % info.block_size:
        raise HeaderFault(
            f"{label} first dim {dims[0]} is not a multiple of {info.name}'s block size {info.block_size}"
        )
    # The bound uses every dim as at least 1: ggml computes strides from all of them, so
    # (0, 2^40, 2^40) would overflow there although it holds no element.
    bound = 1
    count = 1
    for dim in dims:
        bound *= max(dim, 1)
        count *= dim
    if bound // info.block_size * info.type_size > MAX_TENSOR_BYTES:
        raise HeaderFault(f"{label} of shape {list(dims)} is larger than the {MAX_TENSOR_BYTES} byte limit")
    nbytes = count // info.block_size * info.type_size
    return name, dims, ggml_type, offset, nbytes


def _check_layout(tensors: list[GGUFTensor], alignment: int, data_offset: int, file_size: int) -> int:
    """Check that tensor data is contiguous, aligned and inside the file; return the bytes it spans."""
    for t in tensors:
        if t.offset % alignment:
            raise HeaderFault(f"tensor {t.name!r} offset {t.offset} is not aligned to {alignment}")
        if data_offset + t.offset > file_size:
            raise HeaderFault(
                f"tensor {t.name!r} offset {t.offset} is past the end of the file "
                f"({file_size} bytes, data from {data_offset}): the file is truncated or corrupt"
            )
    # llama.cpp requires the data to be packed in order with only alignment padding in between;
    # empty tensors sort first at a shared offset, where they take no room.
    ordered = sorted(tensors, key=lambda t: (t.offset, t.nbytes))
    expected = 0
    prev: GGUFTensor | None = None
    for t in ordered:
        if t.offset != expected:
            if prev is not None and t.offset == prev.offset:
                raise HeaderFault(f"tensors {prev.name!r} and {t.name!r} both start at offset {t.offset}")
            if t.offset < expected and prev is not None:
                raise HeaderFault(
                    f"tensor {t.name!r} at offset {t.offset} overlaps tensor {prev.name!r}, "
                    f"which ends at {prev.offset + prev.nbytes}"
                )
            raise HeaderFault(f"gap before tensor {t.name!r}: it starts at offset {t.offset}, expected {expected}")
        end = t.offset + t.nbytes
        expected = end + (-end % alignment)
        prev = t
    if prev is None:
        return 0
    end = prev.offset + prev.nbytes
    if data_offset + end > file_size:
        raise HeaderFault(
            f"truncated: tensor {prev.name!r} ends at byte {data_offset + end}, the file has {file_size} bytes"
        )
    return end


def _parse(cur: _Cursor) -> GGUFHeader:
    if cur.size == 0:
        raise HeaderFault("empty file")
    magic = cur.source.read_at(0, 4)
    if magic != _MAGIC:
        if len(magic) < 4 and _MAGIC.startswith(magic):
            raise HeaderFault(f"truncated: {cur.size} bytes, not even a GGUF magic")
        raise HeaderFault(f"not a GGUF file: magic {magic!r} is not {_MAGIC!r}")
    cur.pos = 4
    version = cur.unpack(_U32, "version")
    if version not in (2, 3):
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in (1, 2, 3):
            raise HeaderFault(f"big-endian GGUF (version {swapped}) is not supported")
        raise HeaderFault(f"GGUF version {version} is not supported (only 2 and 3)")
    n_tensors = cur.unpack(_U64, "tensor count")
    n_kv = cur.unpack(_U64, "metadata count")
    # Counts are bounded by the bytes left before anything is read: 2^63 fails here at once.
    if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > cur.left():
        raise HeaderFault(
            f"truncated or corrupt: {n_kv} metadata entries and {n_tensors} tensors cannot fit "
            f"in the {cur.left()} bytes left"
        )

    kv: dict[str, Any] = {}
    alignment = DEFAULT_ALIGNMENT
    for index in range(n_kv):
        key = cur.string(f"metadata key {index}")
        if not key:
            raise HeaderFault(f"metadata key {index} is empty")
        if key in kv:
            raise HeaderFault(f"duplicate metadata key {key!r}")
        vtype = cur.unpack(_U32, f"value type of key {key!r}")
        value = _read_value(cur, vtype, key)
        if key == "general.alignment":
            alignment = _check_alignment(value, vtype)
        kv[key] = value

    if n_tensors * _MIN_TENSOR_INFO_BYTES > cur.left():
        raise HeaderFault(f"truncated: {n_tensors} tensor infos cannot fit in the {cur.left()} bytes left")
    tensors: list[GGUFTensor] = []
    seen: set[str] = set()
    for index in range(n_tensors):
        name, dims, ggml_type, offset, nbytes = _read_tensor_info(cur, index)
        if name in seen:
            raise HeaderFault(f"duplicate tensor name {name!r}")
        seen.add(name)
        tensors.append(GGUFTensor(name, dims, ggml_type, offset, nbytes))

    data_offset = cur.pos + (-cur.pos % alignment)
    data_bytes = _check_layout(tensors, alignment, data_offset, cur.size)
    return GGUFHeader(
        version=version,
        alignment=alignment,
        kv=kv,
        tensors=tensors,
        data_offset=data_offset,
        data_bytes=data_bytes,
        file_size=cur.size,
    )


def read_gguf_header(source: ByteSource | str | os.PathLike[str], *, name: str | None = None) -> GGUFHeader:
    """Read and validate the header of a GGUF file, v2 or v3, little-endian.

    ``source`` is a path or any :class:`ByteSource`; ``name`` labels the messages (default: the file
    name). Raises ``AnyformerError(BAD_MODEL)`` with a one-line message naming the fault for any
    malformed, truncated or hostile input; no other exception escapes (errors a ByteSource raises as
    ``AnyformerError`` pass through unchanged).
    """
    if not isinstance(source, (str, os.PathLike)):
        return read_header(source, name, "GGUF", lambda byte_source: _parse(_Cursor(byte_source)))
    identity = _file_identity(source)
    cached = _HEADER_CACHE.get(identity) if identity is not None else None
    if cached is not None and _header_digest(source, cached[0].data_offset) == cached[1]:
        return cached[0]
    header = read_header(source, name, "GGUF", lambda byte_source: _parse(_Cursor(byte_source)))
    if identity is not None:
        digest = _header_digest(source, header.data_offset)
        if digest is not None:
            _HEADER_CACHE[identity] = (header, digest)
            while len(_HEADER_CACHE) > _HEADER_CACHE_SIZE:
                del _HEADER_CACHE[next(iter(_HEADER_CACHE))]
    return header


# One command reads a GGUF's header to describe the model and again to load it (and a server loads
# the same file again): the validated header of a local file is kept while the file is unchanged.
# Unchanged means the same place, inode, size and times *and* the same header bytes: file times
# can be coarser than two writes, and hashing the header's bytes costs a few ms where parsing it
# costs tens.
_HEADER_CACHE: dict[tuple[Any, ...], tuple[GGUFHeader, bytes]] = {}
_HEADER_CACHE_SIZE = 8


def _file_identity(path: str | os.PathLike[str]) -> tuple[Any, ...] | None:
    """Where a local file is, its inode, size and change times (None when it cannot be stat'ed)."""
    try:
        st = os.stat(path)
    except OSError:
        return None  # read_header reports it
    return (os.path.abspath(os.fspath(path)), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _header_digest(path: str | os.PathLike[str], length: int) -> bytes | None:
    """A hash of the file's first ``length`` bytes (its header), or None when they cannot all be read."""
    try:
        data = read_file_prefix(path, length)  # a FIFO swapped in is refused, not waited on
    except OSError:
        return None
    if len(data) != length:
        return None
    return hashlib.blake2b(data, digest_size=32).digest()


def split_set_members(names: Iterable[str]) -> dict[str, list[str]]:
    """Group shard names by their base (the part before ``-00001-of-00003.gguf``), each list sorted.

    Names that are not shards are left out.
    """
    groups: dict[str, list[str]] = {}
    for file_name in names:
        match = SPLIT_RE.search(file_name)
        if match:
            groups.setdefault(file_name[: match.start()], []).append(file_name)
    return {base: sorted(members) for base, members in groups.items()}


def _split_int(header: GGUFHeader, key: str, shard: str) -> int:
    value = header.kv.get(key)
    if value is None:
        raise HeaderFault(f"shard {shard!r} has no {key}")
    if not _is_int(value):
        raise HeaderFault(f"shard {shard!r} {key} is {value!r}, not an integer")
    return int(value)


def check_split_set(headers: Sequence[tuple[str, GGUFHeader]]) -> None:
    """Check that the shards of one split set (``x-00001-of-00003.gguf`` ...) form the whole set.

    ``headers`` pairs each shard's file name with its header. Every shard 1..count must be present
    once; ``split.no`` (0-based, as llama.cpp's gguf-split writes it) must match the file name's
    index; ``split.count`` must agree everywhere and with the names; the tensor counts must add up
    to ``split.tensors.count``; no tensor may be in two shards. Raises BAD_MODEL naming the shard.
    """
    try:
        _check_split_set(headers)
    except HeaderFault as exc:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"split set: {exc}") from exc


def _check_split_set(headers: Sequence[tuple[str, GGUFHeader]]) -> None:
    if not headers:
        raise HeaderFault("no shards")
    by_index: dict[int, str] = {}
    index_of: dict[str, int] = {}
    base: str | None = None
    count: int | None = None
    for shard, _ in headers:
        match = SPLIT_RE.search(shard)
        if not match:
            raise HeaderFault(f"{shard!r} is not named like a shard (name-00001-of-00003.gguf)")
        index, name_count = int(match.group(1)), int(match.group(2))
        if base is None:
            base, count = shard[: match.start()], name_count
        elif shard[: match.start()] != base:
            raise HeaderFault(f"shard {shard!r} belongs to another set than {base!r}")
        elif name_count != count:
            raise HeaderFault(f"shard {shard!r} says {name_count} shards, others say {count}")
        if not 1 <= index <= name_count:
            raise HeaderFault(f"shard {shard!r} has index {index}, outside 1..{name_count}")
        if index in by_index:
            raise HeaderFault(f"shard {shard!r} and {by_index[index]!r} have the same index {index}")
        by_index[index] = shard
        index_of[shard] = index
    assert count is not None  # set by the first shard, and there is one
    missing = [i for i in range(1, count + 1) if i not in by_index]
    if missing:
        raise HeaderFault(f"shard {missing[0]:05d} of {count:05d} of {base!r} is missing")

    tensors_total = 0
    expected_tensors: int | None = None
    owner: dict[str, str] = {}
    for shard, header in headers:
        index = index_of[shard]
        split_no = _split_int(header, _SPLIT_NO, shard)
        split_count = _split_int(header, _SPLIT_COUNT, shard)
        split_tensors = _split_int(header, _SPLIT_TENSORS, shard)
        if split_no != index - 1:
            raise HeaderFault(f"shard {shard!r} has split.no {split_no}, its name says {index - 1} (0-based)")
        if split_count != count:
            raise HeaderFault(f"shard {shard!r} has split.count {split_count}, the names say {count}")
        if expected_tensors is None:
            expected_tensors = split_tensors
        elif split_tensors != expected_tensors:
            raise HeaderFault(
                f"shard {shard!r} has split.tensors.count {split_tensors}, another shard says {expected_tensors}"
            )
        for tensor in header.tensors:
            if tensor.name in owner:
                raise HeaderFault(f"tensor {tensor.name!r} is in both {owner[tensor.name]!r} and {shard!r}")
            owner[tensor.name] = shard
        tensors_total += len(header.tensors)
    if tensors_total != expected_tensors:
        raise HeaderFault(f"the shards hold {tensors_total} tensors, split.tensors.count says {expected_tensors}")
