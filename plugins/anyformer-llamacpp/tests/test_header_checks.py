"""The vocabulary check that keeps llama.cpp from aborting, on a vocabulary as the header reader keeps it."""

from __future__ import annotations

import struct

import pytest

from anyformer import AnyformerError, ErrorCode
from anyformer.plugin import LazyArray
from anyformer_llamacpp.header_checks import check_vocabulary


def lazy_strings(items: list[str]) -> LazyArray:
    raw = b"".join(struct.pack("<Q", len(item.encode())) + item.encode() for item in items)
    return LazyArray(raw, len(items), "")


@pytest.mark.parametrize("kept", [list, lazy_strings])
def test_a_repeated_token_is_refused_by_index(kept) -> None:  # type: ignore[no-untyped-def]
    tokens = [f"tok{i}" for i in range(1000)] + ["é"] * 2
    tokens[700] = "tok12"
    with pytest.raises(AnyformerError) as caught:
        check_vocabulary("m.gguf", kept(tokens))
    assert caught.value.code is ErrorCode.BAD_MODEL
    assert "token 700 ('tok12') repeats token 12" in caught.value.message


@pytest.mark.parametrize("kept", [list, lazy_strings])
def test_a_vocabulary_without_repeats_passes_undecoded(kept) -> None:  # type: ignore[no-untyped-def]
    tokens = [f"tok{i}" for i in range(1000)] + ["é", "e"]
    vocabulary = kept(tokens)
    check_vocabulary("m.gguf", vocabulary)
    if isinstance(vocabulary, LazyArray):
        assert vocabulary._decoded is None


def test_a_long_vocabulary_of_numbers_is_checked_like_a_list() -> None:
    numbers = LazyArray(struct.pack("<300i", *range(299), 5), 300, "i")
    with pytest.raises(AnyformerError) as caught:
        check_vocabulary("m.gguf", numbers)
    assert "token 299 (5) repeats token 5" in caught.value.message


@pytest.mark.parametrize("kept", [list, lazy_strings])
def test_the_longest_token_is_measured_in_utf8_bytes_without_decoding(kept) -> None:  # type: ignore[no-untyped-def]
    from anyformer_llamacpp.engine import _longest_token_bytes

    vocabulary = kept([f"tok{i}" for i in range(300)] + ["ééé", "▁the"])
    assert _longest_token_bytes(vocabulary) == 6  # "ééé": three 2-byte characters
    if isinstance(vocabulary, LazyArray):
        assert vocabulary._decoded is None
    assert _longest_token_bytes(kept([])) is None
