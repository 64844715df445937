"""Validated GGUF headers handed to a worker (``_gguf_share``): the same header, used only while the file agrees."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hostile_files import F32, I32, STRING, U32, Tensor, kv, kv_array, make_gguf

from anyformer.files import _gguf_header
from anyformer.files._gguf_header import LAZY_ARRAY_ELEMENTS, LazyArray, read_gguf_header
from anyformer.files._gguf_share import adopt_shared_headers, shared_headers

LONG = LAZY_ARRAY_ELEMENTS + 44


def _gguf(name: str = "tiny") -> bytes:
    """A GGUF with every kind of value: long string, float and int arrays (lazy), short ones, NaN."""
    return make_gguf(
        [Tensor("token_embd.weight", (32, 4), 0), Tensor("output_norm.weight", (8,), 0)],
        [
            kv("general.architecture", STRING, "llama"),
            kv("general.name", STRING, name),
            kv("llama.block_count", U32, 2),
            kv("llama.rope.freq_base", F32, float("nan")),
            kv("tokenizer.ggml.add_bos_token", 7, True),
            kv_array("general.languages", STRING, ["en", "fr"]),
            kv_array("tokenizer.ggml.tokens", STRING, [f"tok{i}é" * (i % 7) for i in range(LONG)]),
            kv_array("tokenizer.ggml.scores", F32, [float(-i) for i in range(LONG)]),
            kv_array("tokenizer.ggml.token_type", I32, [i % 5 for i in range(LONG)]),
        ],
    )


@pytest.fixture(autouse=True)
def empty_cache() -> Iterator[None]:
    _gguf_header._HEADER_CACHE.clear()
    yield
    _gguf_header._HEADER_CACHE.clear()


def _shared_and_forgotten(tmp_path: Path, name: str = "tiny") -> tuple[Path, list[dict[str, Any]]]:
    """A GGUF written and read here, its headers through a frame, then this process's header cache emptied: the
    worker's position."""
    model = tmp_path / "m.gguf"
    model.write_bytes(_gguf(name))
    read_gguf_header(model)
    entries = _through_a_frame(model)
    _gguf_header._HEADER_CACHE.clear()
    return model, entries


def _through_a_frame(path: Path | str) -> list[dict[str, Any]]:
    """What the worker receives: the entries through JSON, as a frame carries them."""
    entries: list[dict[str, Any]] = json.loads(json.dumps(shared_headers(path)))
    return entries


def _no_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(cursor: object) -> None:
        raise AssertionError("the header was parsed again")

    monkeypatch.setattr(_gguf_header, "_parse", refuse)


def test_an_adopted_header_is_the_parsed_one_and_is_not_parsed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(_gguf())
    parsed = read_gguf_header(model)
    assert isinstance(parsed.kv["tokenizer.ggml.tokens"], LazyArray)
    entries = _through_a_frame(model)
    _gguf_header._HEADER_CACHE.clear()
    assert adopt_shared_headers(entries) == 1
    _no_parsing(monkeypatch)
    adopted = read_gguf_header(model)
    nan_key = "llama.rope.freq_base"  # NaN equals nothing, itself included
    assert {k: v for k, v in adopted.kv.items() if k != nan_key} == {k: v for k, v in parsed.kv.items() if k != nan_key}
    assert adopted.get("tokenizer.ggml.tokens") == parsed.get("tokenizer.ggml.tokens")
    assert adopted.kv["tokenizer.ggml.tokens"].raw_strings() == parsed.kv["tokenizer.ggml.tokens"].raw_strings()
    assert adopted.get("tokenizer.ggml.scores") == [float(-i) for i in range(LONG)]
    assert adopted.get("general.languages") == ["en", "fr"]
    assert adopted.get("tokenizer.ggml.add_bos_token") is True
    assert isinstance(adopted.get("llama.block_count"), int)
    assert math.isnan(adopted.get("llama.rope.freq_base"))
    assert adopted.tensors == parsed.tensors and adopted.data_offset == parsed.data_offset


def test_a_header_whose_digest_the_file_does_not_match_is_parsed_anew(tmp_path: Path) -> None:
    model, entries = _shared_and_forgotten(tmp_path)
    entries[0]["digest"] = "00" * 32  # not the hash of the file's header bytes
    entries[0]["header"]["kv"]["general.name"] = "not what the file says"
    assert adopt_shared_headers(entries) == 0
    assert read_gguf_header(model).get("general.name") == "tiny"


def test_a_file_rewritten_after_sharing_is_read_anew(tmp_path: Path) -> None:
    model, entries = _shared_and_forgotten(tmp_path, "tiny")
    model.write_bytes(_gguf("tina"))  # the same size, another name
    assert adopt_shared_headers(entries) == 0  # its header bytes no longer match the digest
    assert read_gguf_header(model).get("general.name") == "tina"


def test_a_file_rewritten_after_adoption_is_read_anew(tmp_path: Path) -> None:
    model, entries = _shared_and_forgotten(tmp_path, "tiny")
    assert adopt_shared_headers(entries) == 1
    model.write_bytes(_gguf("tina"))
    assert read_gguf_header(model).get("general.name") == "tina"


def test_only_the_models_files_are_shared_and_a_missing_file_is_skipped(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    inside, beside = folder / "a.gguf", tmp_path / "model2.gguf"  # beside shares the folder's name as a prefix
    inside.write_bytes(_gguf())
    beside.write_bytes(_gguf())
    read_gguf_header(inside)
    read_gguf_header(beside)
    assert [entry["path"] for entry in shared_headers(folder)] == [str(inside)]
    assert [entry["path"] for entry in shared_headers(inside)] == [str(inside)]
    entries = _through_a_frame(folder)
    inside.unlink()
    _gguf_header._HEADER_CACHE.clear()
    assert adopt_shared_headers(entries) == 0 and not _gguf_header._HEADER_CACHE


def test_a_header_whose_arrays_have_no_place_in_the_file_is_not_shared(tmp_path: Path) -> None:
    """Only a header whose arrays' place in the file is known can be rebuilt from the file."""
    model = tmp_path / "m.gguf"
    model.write_bytes(_gguf())
    read_gguf_header(model)
    key = next(iter(_gguf_header._HEADER_CACHE))
    cached, digest = _gguf_header._HEADER_CACHE[key]
    lazy = cached.kv["tokenizer.ggml.tokens"]
    kv = {**cached.kv, "tokenizer.ggml.tokens": LazyArray(lazy._raw, len(lazy), "")}
    _gguf_header._HEADER_CACHE[key] = (dataclasses.replace(cached, kv=kv), digest)
    assert shared_headers(model) == []


def test_an_array_outside_the_header_is_refused(tmp_path: Path) -> None:
    _, entries = _shared_and_forgotten(tmp_path)
    entries[0]["header"]["kv"]["tokenizer.ggml.tokens"]["lazy"][2] = 1 << 40
    with pytest.raises(ValueError, match="outside the header"):
        adopt_shared_headers(entries)
