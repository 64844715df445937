"""The safetensors header reader against SAFETY.md T1, and valid files."""

from __future__ import annotations

import json
import random
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from hostile_files import make_safetensors, u64

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.files._gguf_header import BytesByteSource
from anyformer.files._safetensors_header import SafetensorsTensor, read_safetensors_header


def write(tmp_path: Path, data: bytes, name: str = "model.safetensors") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def bad(tmp_path: Path, data: bytes, *fragments: str) -> None:
    """Assert that reading ``data`` from a file raises BAD_MODEL naming the file and every fragment."""
    __tracebackhide__ = True
    with pytest.raises(AnyformerError) as info:
        read_safetensors_header(write(tmp_path, data))
    err = info.value
    assert err.code is ErrorCode.BAD_MODEL, f"code was {err.code}, expected BAD_MODEL"
    assert err.message.startswith("model.safetensors: "), f"message {err.message!r} does not name the file"
    for fragment in fragments:
        assert fragment in err.message, f"message {err.message!r} does not say {fragment!r}"


def two_tensors() -> tuple[dict[str, Any], bytes]:
    header = {
        "__metadata__": {"format": "pt"},
        "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "b": {"dtype": "BF16", "shape": [3], "data_offsets": [24, 30]},
    }
    return header, bytes(30)


def test_valid_file_parses(tmp_path: Path) -> None:
    header, data = two_tensors()
    raw = json.dumps(header).encode()
    parsed = read_safetensors_header(write(tmp_path, make_safetensors(header, data)))
    assert parsed.tensors == {
        "w": SafetensorsTensor("F32", (2, 3), 0, 24),
        "b": SafetensorsTensor("BF16", (3,), 24, 30),
    }
    assert parsed.metadata == {"format": "pt"}
    assert parsed.data_offset == 8 + len(raw)
    assert parsed.parameter_count == 9


def test_space_padded_header_and_no_metadata(tmp_path: Path) -> None:
    raw = json.dumps({"x": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}).encode() + b"       "
    parsed = read_safetensors_header(write(tmp_path, make_safetensors(raw, b"abcd")))
    assert parsed.metadata == {}
    assert parsed.tensors["x"].shape == (4,)


def test_empty_tensors_and_sub_byte_dtypes(tmp_path: Path) -> None:
    header = {
        "e": {"dtype": "F16", "shape": [0, 7], "data_offsets": [0, 0]},
        "f4": {"dtype": "F4", "shape": [2, 4], "data_offsets": [0, 4]},
        "s": {"dtype": "F64", "shape": [], "data_offsets": [4, 12]},
    }
    parsed = read_safetensors_header(write(tmp_path, make_safetensors(header, bytes(12))))
    assert parsed.tensors["s"].shape == ()


def test_written_by_safetensors_package(tmp_path: Path) -> None:
    numpy_api = pytest.importorskip("safetensors.numpy")
    np = pytest.importorskip("numpy")
    path = tmp_path / "model.safetensors"
    numpy_api.save_file(
        {"a": np.zeros((3, 5), dtype=np.float16), "b": np.ones(7, dtype=np.int64)}, str(path), metadata={"k": "v"}
    )
    parsed = read_safetensors_header(path)
    assert {name: (t.dtype, t.shape) for name, t in parsed.tensors.items()} == {
        "a": ("F16", (3, 5)),
        "b": ("I64", (7,)),
    }
    assert parsed.metadata == {"k": "v"}


def test_byte_source_is_accepted() -> None:
    header, data = two_tensors()
    parsed = read_safetensors_header(BytesByteSource(make_safetensors(header, data)), name="remote.safetensors")
    assert set(parsed.tensors) == {"w", "b"}


# T1: header length 2^63, and lengths that do not fit.


@pytest.mark.parametrize("length", [2**63, 2**64 - 1, 100 * 1024 * 1024 + 1])
def test_t1_huge_header_length(tmp_path: Path, length: int) -> None:
    start = time.perf_counter()
    bad(tmp_path, make_safetensors("{}", header_len=length), f"header length {length}", "limit")
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("length", [3, 1000])
def test_t1_header_longer_than_the_file(tmp_path: Path, length: int) -> None:
    bad(tmp_path, make_safetensors("{}", header_len=length)[: 8 + 2], "truncated", f"header length {length}")


@pytest.mark.parametrize("size", [0, 1, 7])
def test_t1_file_shorter_than_the_length_prefix(tmp_path: Path, size: int) -> None:
    bad(tmp_path, b"\x01" * size, "truncated")


# T1: duplicate JSON keys anywhere.


@pytest.mark.parametrize(
    "raw",
    [
        '{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
        '"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
        '{"w": {"dtype": "U8", "dtype": "F32", "shape": [1], "data_offsets": [0, 1]}}',
        '{"__metadata__": {"a": "1", "a": "2"}, "w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
        '{"__metadata__": {}, "__metadata__": {}, "w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
    ],
)
def test_t1_duplicate_json_keys(tmp_path: Path, raw: str) -> None:
    bad(tmp_path, make_safetensors(raw, b"\x00"), "duplicate JSON key")


# T1: overlapping, holes and trailing data.


def test_t1_overlapping_tensors(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
    }
    bad(tmp_path, make_safetensors(header, bytes(12)), "tensor 'b'", "overlaps tensor 'a'")


def test_t1_two_tensors_sharing_bytes(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    }
    bad(tmp_path, make_safetensors(header, bytes(8)), "overlaps")


def test_t1_hole_between_tensors(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
    }
    bad(tmp_path, make_safetensors(header, bytes(12)), "hole of 4 bytes before tensor 'b'")


@pytest.mark.parametrize("extra", [1, 4096])
def test_t1_trailing_data(tmp_path: Path, extra: int) -> None:
    header, data = two_tensors()
    bad(tmp_path, make_safetensors(header, data + bytes(extra)), f"{extra} bytes of trailing data")


def test_t1_data_cut_short(tmp_path: Path) -> None:
    header, data = two_tensors()
    bad(tmp_path, make_safetensors(header, data[:-1]), "truncated", "tensor 'b'")


# T1: malformed entries.


@pytest.mark.parametrize(
    ("entry", "fault"),
    [
        ({"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}, "unknown dtype 'F33'"),
        ({"dtype": 5, "shape": [1], "data_offsets": [0, 4]}, "unknown dtype 5"),
        ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, "not a list of non-negative integers"),
        ({"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}, "not a list of non-negative integers"),
        ({"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}, "not a list of non-negative integers"),
        ({"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}, "not a list of non-negative integers"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [0]}, "is not [start, end]"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}, "not 0 <= start <= end"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}, "not 0 <= start <= end"),
        ({"dtype": "F16", "shape": [1], "data_offsets": [0, 4]}, "needs 2 bytes"),
        ({"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 4]}, "needs more bytes"),
        ({"dtype": "F32", "shape": [1]}, "has no data_offsets"),
        ({"shape": [1], "data_offsets": [0, 4]}, "has no dtype"),
        ({"dtype": "F4", "shape": [3], "data_offsets": [0, 4]}, "does not fill whole bytes"),
        ([1, 2], "is not a JSON object"),
    ],
)
def test_t1_malformed_tensor_entry(tmp_path: Path, entry: object, fault: str) -> None:
    bad(tmp_path, make_safetensors({"t": entry}, bytes(4)), "tensor 't'", fault)


def test_t1_very_long_shape_is_cheap(tmp_path: Path) -> None:
    start = time.perf_counter()
    bad(tmp_path, make_safetensors({"t": {"dtype": "U8", "shape": [2**60] * 100000, "data_offsets": [0, 4]}}, bytes(4)))
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize(
    ("raw", "fault"),
    [
        (b"[]", "not an object"),
        (b'"x"', "not an object"),
        (b"{", "not valid JSON"),
        (b"", "not valid JSON"),
        (b'{"a": NaN}', "NaN"),
        (b'{"\xff": 1}', "not valid UTF-8"),
        (b'{"__metadata__": {"a": 1}}', "__metadata__ is not an object of strings"),
        (b'{"__metadata__": [1]}', "__metadata__ is not an object of strings"),
        (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
        (b"{" + b'"a":{' * 50000 + b"}" * 50001, ""),
        (b'{"a": 1' + b"0" * 5000 + b"}", ""),
    ],
)
def test_t1_malformed_json(tmp_path: Path, raw: bytes, fault: str) -> None:
    bad(tmp_path, make_safetensors(raw), fault)


@pytest.mark.parametrize("seed", range(5))
def test_random_mutations_only_raise_bad_model(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    header, data = two_tensors()
    original = make_safetensors(header, data)
    for _ in range(300):
        mutated = bytearray(original)
        pos = rng.randrange(len(mutated))
        if rng.random() < 0.7:
            mutated[pos] = rng.randrange(256)
        elif rng.random() < 0.5:
            mutated[0:8] = u64(rng.randrange(len(original) * 2))
        else:
            del mutated[pos:]
        try:
            read_safetensors_header(BytesByteSource(bytes(mutated)))
        except AnyformerError as exc:
            assert exc.code is ErrorCode.BAD_MODEL


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(AnyformerError) as info:
        read_safetensors_header(tmp_path / "absent.safetensors")
    assert info.value.code is ErrorCode.BAD_MODEL


def test_header_length_is_little_endian(tmp_path: Path) -> None:
    header, data = two_tensors()
    raw = json.dumps(header).encode()
    big_endian = struct.pack(">Q", len(raw)) + raw + data
    bad(tmp_path, big_endian, "header length")
