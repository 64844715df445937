"""Long GGUF arrays kept as validated bytes (LazyArray): the same values and the same refusals as a full read."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hostile_files import (
    ARRAY,
    BOOL,
    F32,
    I32,
    STRING,
    Tensor,
    array_payload,
    gguf_str,
    kv,
    kv_array,
    kv_raw,
    make_gguf,
    u32,
    u64,
)

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.files._gguf_header import (
    LAZY_ARRAY_ELEMENTS,
    MAX_STRING_BYTES,
    BytesByteSource,
    LazyArray,
    read_gguf_header,
)

LONG = LAZY_ARRAY_ELEMENTS + 44  # an array the reader keeps lazy


def read(data: bytes):  # type: ignore[no-untyped-def]
    return read_gguf_header(BytesByteSource(data), name="model.gguf")


def bad(data: bytes, *fragments: str) -> str:
    with pytest.raises(AnyformerError) as info:
        read(data)
    assert info.value.code is ErrorCode.BAD_MODEL
    for fragment in fragments:
        assert fragment in info.value.message, info.value.message
    return info.value.message


def strings_payload(items: list[bytes]) -> bytes:
    return u32(STRING) + u64(len(items)) + b"".join(gguf_str(item) for item in items)


def random_tokens(rng: random.Random, count: int, long_every: int = 0) -> list[str]:
    alphabet = "abcxyz é€𝄞Ġ<>|\n\x00"
    tokens = []
    for index in range(count):
        length = rng.randrange(300) if long_every and index % long_every == 0 else rng.randrange(12)
        tokens.append("".join(rng.choice(alphabet) for _ in range(length)))
    return tokens


@pytest.mark.parametrize("long_every", [0, 7, 1])
def test_long_string_arrays_read_the_same_values(long_every: int) -> None:
    tokens = random_tokens(random.Random(long_every), 2000, long_every)
    header = read(make_gguf([Tensor("w")], [kv_array("tokenizer.ggml.tokens", STRING, tokens)]))
    lazy = header.kv["tokenizer.ggml.tokens"]
    assert isinstance(lazy, LazyArray) and len(lazy) == len(tokens)
    assert lazy.raw_strings() == [t.encode() for t in tokens]
    assert lazy.raw_strings() is lazy.raw_strings()  # cut once
    assert header.get("tokenizer.ggml.tokens") == tokens
    assert lazy[3] == tokens[3] and list(lazy) == tokens


def test_an_array_spanning_several_read_blocks_with_a_long_element_across_a_boundary() -> None:
    tokens = [f"t{i}" for i in range(200_000)]  # ~2 MB: the reader's 1 MiB buffer refills inside it
    tokens[150_000] = "y" * (3 * 1024 * 1024)  # longer than a block: its bytes are read across refills
    header = read(make_gguf([Tensor("w")], [kv_array("tokenizer.ggml.tokens", STRING, tokens)]))
    assert header.get("tokenizer.ggml.tokens") == tokens
    assert header.summary()["vocab_size"] == len(tokens)


def test_short_arrays_stay_lists_and_the_summary_does_not_decode_a_long_one() -> None:
    short = [f"s{i}" for i in range(LAZY_ARRAY_ELEMENTS)]
    tokens = [f"t{i}" for i in range(LONG)]
    header = read(
        make_gguf(kvs=[kv_array("a.short", STRING, short), kv_array("tokenizer.ggml.tokens", STRING, tokens)])
    )
    assert type(header.kv["a.short"]) is list
    summary = header.summary()
    assert summary["vocab_size"] == LONG
    assert header.kv["tokenizer.ggml.tokens"]._decoded is None  # counted, never decoded


@pytest.mark.parametrize(
    ("etype", "values"),
    [(I32, list(range(-150, 150))), (F32, [0.5 * i for i in range(LONG)]), (BOOL, [i % 3 == 0 for i in range(LONG)])],
)
def test_long_numeric_arrays_read_the_same_values(etype: int, values: list[object]) -> None:
    header = read(make_gguf(kvs=[kv_array("tokenizer.ggml.scores", etype, values)]))
    assert isinstance(header.kv["tokenizer.ggml.scores"], LazyArray)
    assert header.get("tokenizer.ggml.scores") == values


# Every refusal of the full read is still made while reading the header, at the same element.


@pytest.mark.parametrize(
    "element",
    [
        b"\x80",  # a continuation byte first
        b"ab\xc3",  # a two-byte sequence cut at the end (the next length prefix follows)
        b"\xed\xa0\x80",  # a UTF-16 surrogate
        b"\xc0\xaf",  # an overlong encoding
        b"x" * 200 + b"\xff",  # a long element (its length prefix is not ASCII)
        b"\xe2\x82" + b"x" * 200,  # a long element with a cut sequence at its start
    ],
)
@pytest.mark.parametrize("where", [0, 130, LONG - 1])
def test_an_element_that_is_not_utf8_is_refused_by_index(element: bytes, where: int) -> None:
    items = [f"tok{i}".encode() for i in range(LONG)]
    items[where] = element
    payload = strings_payload(items)
    bad(make_gguf(kvs=[kv_raw("tokenizer.ggml.tokens", ARRAY, payload)]), f"element {where} is not valid UTF-8")


def test_a_sequence_split_across_two_elements_is_refused() -> None:
    # "é" is \xc3\xa9: each half alone is invalid, although the two would decode side by side.
    for first, second in ((b"a\xc3", b"\xa9b"), (b"x" * 150 + b"\xc3", b"\xa9"), (b"\xc3", b"\xa9" + b"y" * 150)):
        items = [b"t"] * LONG
        items[10], items[11] = first, second
        payload = strings_payload(items)
        bad(make_gguf(kvs=[kv_raw("tokenizer.ggml.tokens", ARRAY, payload)]), "element 10 is not valid UTF-8")


def test_the_last_element_cut_by_the_end_of_the_array_is_refused() -> None:
    items = [b"t"] * LONG
    items[-1] = b"\xe2\x82"
    # The next key's length prefix is ASCII: together they would still not decode.
    data = make_gguf(kvs=[kv_raw("tokenizer.ggml.tokens", ARRAY, strings_payload(items)), kv("general.k", 4, 1)])
    bad(data, f"element {LONG - 1} is not valid UTF-8")


@pytest.mark.parametrize("length", [500, 2**40, MAX_STRING_BYTES + 1, 2**64 - 1])
def test_element_lengths_are_bounded_in_a_long_array(length: int) -> None:
    payload = strings_payload([b"t"] * LONG)[:-9] + gguf_str(b"b", length=length)
    message = bad(make_gguf(kvs=[kv_raw("tokenizer.ggml.tokens", ARRAY, payload)]), f"element {LONG - 1}")
    assert "truncated" in message or "limit" in message


def test_a_long_array_cut_by_the_end_of_the_file_is_refused() -> None:
    payload = array_payload(STRING, [f"t{i}" for i in range(LONG)])
    data = make_gguf(kvs=[kv_raw("tokenizer.ggml.tokens", ARRAY, payload)])
    cut = data.index(gguf_str(f"t{LONG - 5}"))
    bad(data[:cut], "truncated")


# A local file's header is read once while the file is unchanged.


def test_a_path_is_read_once_until_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(make_gguf([Tensor("w")], [kv("general.name", STRING, "one")]))
    first = read_gguf_header(path)
    assert read_gguf_header(path) is first
    path.write_bytes(make_gguf([Tensor("w")], [kv("general.name", STRING, "two!")]))
    assert read_gguf_header(path).get("general.name") == "two!"


def test_a_replaced_file_of_the_same_size_and_time_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(make_gguf([Tensor("w")], [kv("general.name", STRING, "one")]))
    stat = path.stat()
    assert read_gguf_header(path).get("general.name") == "one"
    other = tmp_path / "other.gguf"
    other.write_bytes(make_gguf([Tensor("w")], [kv("general.name", STRING, "two")]))
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(other, path)  # a new inode under the old name
    assert read_gguf_header(path).get("general.name") == "two"


def test_a_file_rewritten_within_one_tick_of_its_clock_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from anyformer.files import _gguf_header

    # File times can be coarser than two writes: then only the header's bytes tell the files apart.
    monkeypatch.setattr(_gguf_header, "_file_identity", lambda path: ("same", 1, 2, 3))
    path = tmp_path / "m.gguf"
    path.write_bytes(make_gguf([Tensor("w")], [kv("general.name", STRING, "one")]))
    assert read_gguf_header(path).get("general.name") == "one"
    path.write_bytes(make_gguf([Tensor("w")], [kv("general.name", STRING, "two")]))
    assert read_gguf_header(path).get("general.name") == "two"
    path.write_bytes(make_gguf([Tensor("w")], [kv("general.name", STRING, b"\xff\xfe\xfd")]))
    with pytest.raises(AnyformerError) as caught:
        read_gguf_header(path)
    assert caught.value.code is ErrorCode.BAD_MODEL


def test_a_hostile_file_is_refused_every_time(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(make_gguf(kvs=[kv("general.name", STRING, b"\xff")]))
    for _ in range(2):
        with pytest.raises(AnyformerError) as info:
            read_gguf_header(path)
        assert info.value.code is ErrorCode.BAD_MODEL


# The prefixes are walked in a tight loop per buffer, and element by element only for a file that breaks a bound.


@pytest.mark.parametrize("long_every", [0, 7, 1])
def test_the_quick_walk_reads_what_the_element_by_element_walk_reads(
    long_every: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from anyformer.files import _gguf_header

    tokens = random_tokens(random.Random(long_every), 3000, long_every)
    data = make_gguf([Tensor("w")], [kv_array("tokenizer.ggml.tokens", STRING, tokens), kv("general.k", 4, 1)])

    def refuse(self: object, count: int, what: str) -> None:
        raise AssertionError("the element-by-element walk was taken")

    with monkeypatch.context() as patch:
        patch.setattr(_gguf_header._Cursor, "_walk_element_by_element", refuse)
        quick = read(data)
        # Buffers of 64 bytes: prefixes and elements (long ones too) cut by a buffer's end, again and again.
        patch.setattr(_gguf_header, "_BLOCK", 64)
        quick_small_buffers = read(data)
    with monkeypatch.context() as patch:
        patch.setattr(_gguf_header._Cursor, "_walk_fast", lambda self, count, what: None)
        careful = read(data)
    assert quick.kv == quick_small_buffers.kv == careful.kv
    assert quick.data_offset == quick_small_buffers.data_offset == careful.data_offset
    assert quick.get("tokenizer.ggml.tokens") == tokens and quick.get("general.k") == 1


@pytest.mark.parametrize("length", [500, 2**40, MAX_STRING_BYTES + 1, 2**64 - 1])
def test_a_bound_the_quick_walk_meets_is_refused_naming_the_element(length: int) -> None:
    """An element over the length limit or past the file leaves the walk to the element-by-element one,
    which names it; nothing is read past the file."""
    items = [b"t"] * 3 + [b"x" * 200] + [b"t"] * (LONG - 4)  # a long element the walk checks on its way
    payload = strings_payload(items)[:-9] + gguf_str(b"b", length=length)  # the last one's length replaced
    message = bad(make_gguf(kvs=[kv_raw("tokenizer.ggml.tokens", ARRAY, payload)]), f"element {LONG - 1}")
    assert "truncated" in message or "limit" in message
