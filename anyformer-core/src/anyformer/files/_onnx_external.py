"""A bounded protobuf walk of ONNX models: their summary, and the external-data paths they name (SAFETY.md O1).

onnx had external-data path traversal twice, and onnxruntime follows a hardlink out of the model
folder, so every ``location`` is checked here before an engine opens the model. The walk is
iterative with an explicit depth limit, checks every length against the buffer and skips what it does
not need in O(1), so a hostile file costs at most one pass over its bytes. Only the standard library
is imported: the onnx package is neither needed nor trusted.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import posixpath
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.files._byte_source import HeaderFault, faults_as_bad_model

__all__ = ["OnnxSummary", "check_onnx_external_data", "read_onnx_summary"]

#: Deepest nesting of messages walked; protobuf's own parsers stop at 100.
MAX_DEPTH = 100
#: A protobuf message cannot exceed 2 GiB, so neither can an ONNX model file.
MAX_MODEL_BYTES = 2**31 - 1

_VARINT, _FIXED64, _LEN, _START_GROUP, _END_GROUP, _FIXED32 = 0, 1, 2, 3, 4, 5

# Message kinds walked on the explicit stack, and the fields of each that lead to another message.
_MODEL, _GRAPH, _NODE, _ATTR, _SPARSE, _TRAINING, _FUNCTION = range(7)
_KIND_NAMES = (
    "ModelProto",
    "GraphProto",
    "NodeProto",
    "AttributeProto",
    "SparseTensorProto",
    "TrainingInfoProto",
    "FunctionProto",
)
# Field numbers from onnx/onnx.proto. "T" marks a TensorProto, parsed as a leaf on the spot.
_TENSOR = "T"
_CHILDREN: dict[int, dict[int, int | str]] = {
    # graph, training_info, functions
    _MODEL: {7: _GRAPH, 20: _TRAINING, 25: _FUNCTION},
    # node, initializer, sparse_initializer
    _GRAPH: {1: _NODE, 5: _TENSOR, 15: _SPARSE},
    # attribute
    _NODE: {5: _ATTR},
    # t, g, tensors, graphs, sparse_tensor, sparse_tensors
    _ATTR: {5: _TENSOR, 6: _GRAPH, 10: _TENSOR, 11: _GRAPH, 22: _SPARSE, 23: _SPARSE},
    # values, indices
    _SPARSE: {1: _TENSOR, 2: _TENSOR},
    # initialization, algorithm
    _TRAINING: {1: _GRAPH, 2: _GRAPH},
    # node, attribute_proto
    _FUNCTION: {7: _NODE, 11: _ATTR},
}

# ModelProto scalar fields read for the summary.
_M_IR_VERSION, _M_PRODUCER, _M_OPSET, _M_METADATA = 1, 2, 8, 14
# TensorProto fields.
_T_NAME, _T_EXTERNAL_DATA, _T_DATA_LOCATION = 8, 13, 14
_EXTERNAL = 1


@dataclasses.dataclass(frozen=True)
class OnnxSummary:
    """What ``describe`` reports about an ONNX model, read without the onnx package."""

    ir_version: int
    producer: str
    #: Operator set versions by domain (``""`` is the default ONNX domain).
    opsets: dict[str, int]
    metadata: dict[str, str]
    #: Every distinct external-data ``location``, in file order.
    external_locations: list[str]


@dataclasses.dataclass(frozen=True)
class _ExternalRef:
    tensor: str
    location: str
    offset: str | None
    length: str | None


def _varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise HeaderFault(f"truncated varint at byte {pos}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise HeaderFault(f"varint longer than 10 bytes at byte {pos}")


def _fields(buf: Any, start: int, end: int, kind: str) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(field, wire_type, value)``: an int for scalars, ``(start, end)`` for length-delimited."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise HeaderFault(f"field number 0 in {kind} at byte {pos}")
        if wire == _VARINT:
            value, pos = _varint(buf, pos, end)
            yield field, wire, value
        elif wire == _LEN:
            length, pos = _varint(buf, pos, end)
            if length > end - pos:
                raise HeaderFault(f"field {field} of {kind} claims {length} bytes, {end - pos} left")
            yield field, wire, (pos, pos + length)
            pos += length
        elif wire in (_FIXED64, _FIXED32):
            width = 8 if wire == _FIXED64 else 4
            if width > end - pos:
                raise HeaderFault(f"truncated fixed-width field {field} of {kind}")
            yield field, wire, int.from_bytes(buf[pos : pos + width], "little")
            pos += width
        else:
            # Groups (3, 4) are not used by ONNX; 6 and 7 are not wire types at all.
            raise HeaderFault(f"wire type {wire} of field {field} in {kind} is not valid in an ONNX model")


def _expect(wire: int, want: int, field: int, kind: str) -> None:
    if wire != want:
        raise HeaderFault(f"field {field} of {kind} has wire type {wire}, expected {want}")


def _text(buf: Any, span: tuple[int, int], what: str, *, strict: bool) -> str:
    raw = bytes(buf[span[0] : span[1]])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if strict:
            raise HeaderFault(f"{what} is not valid UTF-8") from exc
        return raw.decode("utf-8", errors="replace")


def _entry(buf: Any, span: tuple[int, int], what: str, *, strict: bool) -> tuple[str, str]:
    key = value = ""
    for field, wire, val in _fields(buf, span[0], span[1], "StringStringEntryProto"):
        if field in (1, 2):
            _expect(wire, _LEN, field, "StringStringEntryProto")
            if field == 1:
                key = _text(buf, val, f"{what} key", strict=strict)
            else:
                value = _text(buf, val, f"{what} value", strict=strict)
    return key, value


def _tensor(buf: Any, span: tuple[int, int], refs: list[_ExternalRef]) -> None:
    name = ""
    location_kind = 0
    entries: list[tuple[str, str]] = []
    for field, wire, val in _fields(buf, span[0], span[1], "TensorProto"):
        if field == _T_NAME:
            _expect(wire, _LEN, field, "TensorProto")
            name = _text(buf, val, "tensor name", strict=False)
        elif field == _T_DATA_LOCATION:
            _expect(wire, _VARINT, field, "TensorProto")
            location_kind = val
        elif field == _T_EXTERNAL_DATA:
            _expect(wire, _LEN, field, "TensorProto")
            entries.append(_entry(buf, val, "external_data", strict=True))
    if location_kind != _EXTERNAL:
        return
    data = dict(entries)
    if len(data) != len(entries):
        raise HeaderFault(f"tensor {name!r} repeats a key in its external_data")
    location = data.get("location")
    if not location:
        raise HeaderFault(f"tensor {name!r} has external data without a location")
    refs.append(_ExternalRef(name, location, data.get("offset"), data.get("length")))


@dataclasses.dataclass
class _Facts:
    ir_version: int | None = None
    producer: str = ""
    opsets: dict[str, int] = dataclasses.field(default_factory=dict)
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)
    refs: list[_ExternalRef] = dataclasses.field(default_factory=list)


def _model_field(buf: Any, field: int, wire: int, val: Any, facts: _Facts) -> None:
    """Record one ModelProto field that the summary needs."""
    kind_name = _KIND_NAMES[_MODEL]
    if field == _M_IR_VERSION:
        _expect(wire, _VARINT, field, kind_name)
        facts.ir_version = val
    elif field == _M_PRODUCER:
        _expect(wire, _LEN, field, kind_name)
        facts.producer = _text(buf, val, "producer_name", strict=False)
    elif field == _M_OPSET:
        _expect(wire, _LEN, field, kind_name)
        domain, version = _opset(buf, val)
        facts.opsets[domain] = max(version, facts.opsets.get(domain, version))
    elif field == _M_METADATA:
        _expect(wire, _LEN, field, kind_name)
        key, value = _entry(buf, val, "metadata_props", strict=False)
        facts.metadata[key] = value


def _walk(buf: Any, size: int) -> tuple[OnnxSummary, list[_ExternalRef]]:
    facts = _Facts()
    # An explicit stack rather than recursion, since nesting depth is the attacker's choice. It holds
    # one field iterator per open message, depth-first, so memory grows with depth, never with the
    # number of sibling messages.
    stack: list[tuple[int, Iterator[tuple[int, int, Any]]]] = [(_MODEL, _fields(buf, 0, size, _KIND_NAMES[_MODEL]))]
    while stack:
        kind, fields = stack[-1]
        for field, wire, val in fields:
            child = _CHILDREN[kind].get(field)
            if child is None:
                if kind == _MODEL:
                    _model_field(buf, field, wire, val, facts)
                continue
            _expect(wire, _LEN, field, _KIND_NAMES[kind])
            if child == _TENSOR:
                _tensor(buf, val, facts.refs)
                continue
            if len(stack) >= MAX_DEPTH:
                raise HeaderFault(f"messages nested deeper than {MAX_DEPTH}")
            child_kind = int(child)
            stack.append((child_kind, _fields(buf, val[0], val[1], _KIND_NAMES[child_kind])))
            break
        else:
            stack.pop()
    if facts.ir_version is None:
        raise HeaderFault("no ir_version")
    locations = list(dict.fromkeys(ref.location for ref in facts.refs))
    summary = OnnxSummary(facts.ir_version, facts.producer, facts.opsets, facts.metadata, locations)
    return summary, facts.refs


def _opset(buf: Any, span: tuple[int, int]) -> tuple[str, int]:
    domain, version = "", 0
    for field, wire, val in _fields(buf, span[0], span[1], "OperatorSetIdProto"):
        if field == 1:
            _expect(wire, _LEN, field, "OperatorSetIdProto")
            domain = _text(buf, val, "opset domain", strict=False)
        elif field == 2:
            _expect(wire, _VARINT, field, "OperatorSetIdProto")
            version = val
    return domain, version


def _read(path: str | os.PathLike[str]) -> tuple[OnnxSummary, list[_ExternalRef]]:
    label = os.path.basename(os.fspath(path))
    try:
        # O_NONBLOCK keeps open() of a FIFO from blocking; regular files are unaffected.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: cannot read the file: {exc}", cause=exc) from exc
    try:
        with faults_as_bad_model(label, "ONNX model", fault_prefix="not a valid ONNX model: "):
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise HeaderFault("not a regular file")
            if st.st_size == 0:
                raise HeaderFault("empty file")
            if st.st_size > MAX_MODEL_BYTES:
                raise HeaderFault(f"{st.st_size} bytes, more than a protobuf message can hold")
            # mmap: a model with inline weights is walked without reading the weights into memory.
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as buf:
                return _walk(buf, st.st_size)
    finally:
        os.close(fd)


def read_onnx_summary(path: str | os.PathLike[str]) -> OnnxSummary:
    """Walk an ONNX ModelProto and return its summary. Raises BAD_MODEL when it is not a valid one."""
    return _read(path)[0]


def _hub_blobs(folder: str) -> str | None:
    """The ``blobs`` folder of the Hub cache repo that ``folder`` (a real path) is a snapshot of."""
    parts = Path(folder).parts
    # .../models--org--name/snapshots/<revision>[/sub/folders]
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "snapshots" and parts[i - 1].startswith(("models--", "datasets--", "spaces--")):
            return os.path.realpath(os.path.join(*parts[:i], "blobs"))
    return None


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _allowed(real: str, real_folder: str, blobs: str | None) -> bool:
    # A symlink from a Hub snapshot into the same repo's blobs/ is how the Hub cache stores files.
    return _inside(real, real_folder) or (blobs is not None and _inside(real, blobs))


def _decimal(value: str | None, what: str, ref: _ExternalRef) -> int | None:
    if value is None:
        return None
    if not value.isascii() or not value.isdigit():
        raise HeaderFault(f"tensor {ref.tensor!r} external data {what} {value!r} is not a non-negative integer")
    return int(value)


def _check_ref(ref: _ExternalRef, folder: str, real_folder: str, blobs: str | None) -> Path:
    location = ref.location
    label = f"tensor {ref.tensor!r} external data {location!r}"
    if "\x00" in location:
        raise HeaderFault(f"{label} holds a NUL byte")
    # onnxruntime on Windows splits on backslashes too, so they count as separators here.
    posix = location.replace("\\", "/")
    if posix.startswith("/") or (len(posix) > 1 and posix[1] == ":"):
        raise HeaderFault(f"{label} is an absolute path")
    normal = posixpath.normpath(posix)
    if normal == ".." or normal.startswith("../"):
        raise HeaderFault(f"{label} climbs out of the model folder with '..'")
    if normal == ".":
        raise HeaderFault(f"{label} names the model folder itself")
    target = os.path.join(folder, *normal.split("/"))
    if not os.path.lexists(target):
        raise HeaderFault(f"{label} is missing")
    real = os.path.realpath(target)
    if not _allowed(real, real_folder, blobs):
        raise HeaderFault(f"{label} leads outside the model folder (to {real})")
    try:
        st = os.stat(target)
    except OSError as exc:
        raise HeaderFault(f"{label} is missing (a dangling link)") from exc
    if not stat.S_ISREG(st.st_mode):
        raise HeaderFault(f"{label} is not a regular file")
    if st.st_nlink > 1:
        # onnxruntime follows hardlinks, and a hardlink's other name may be anywhere on the disk.
        raise HeaderFault(f"{label} is a hardlink ({st.st_nlink} links); copy it instead")
    offset = _decimal(ref.offset, "offset", ref) or 0
    length = _decimal(ref.length, "length", ref)
    if offset + (length or 0) > st.st_size:
        raise HeaderFault(f"{label} range {offset}+{length or 0} runs past its {st.st_size} bytes")
    return Path(target)


def check_onnx_external_data(model_path: str | os.PathLike[str]) -> list[Path]:
    """Check every external-data file an ONNX model names; return their paths, each once, in order.

    A location must be relative, must stay inside the model's folder (also after following
    symlinks), must exist, be a regular file and not a hardlink, and its offset and length must fit
    the file. In a Hugging Face Hub cache, snapshot files are symlinks into the repo's ``blobs/``;
    such links are accepted, for the model file as for its data. Raises BAD_MODEL naming the tensor
    and the fault, also when the model is not a valid ONNX file.
    """
    label = os.path.basename(os.fspath(model_path))
    _, refs = _read(model_path)
    folder = os.path.dirname(os.path.abspath(model_path))
    real_folder = os.path.realpath(folder)
    blobs = _hub_blobs(real_folder)
    try:
        real_model = os.path.realpath(model_path)
        if not _allowed(real_model, real_folder, blobs):
            raise HeaderFault(f"the model file is a link to {real_model}, outside its folder")
        paths: dict[str, Path] = {}
        for ref in refs:
            path = _check_ref(ref, folder, real_folder, blobs)
            paths.setdefault(str(path), path)
        return list(paths.values())
    except HeaderFault as exc:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: {exc}") from exc
    except (OSError, ValueError) as exc:
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"{label}: cannot check external data ({type(exc).__name__}: {exc})", cause=exc
        ) from exc
