"""Streaming text equals the whole decode, on byte-level and SentencePiece-style tokenizers."""

from __future__ import annotations

from pathlib import Path

import pytest

from anyformer.plugin import IncrementalDetokenizer

TEXT = "Hello, wörld! 東京 is 🗼🌸 — naïve café\n  two  spaces and a tab\t."


@pytest.mark.parametrize("fixture", ["smollm2_dir", "minilm_dir", "tiny_llama_dir"])
def test_streamed_pieces_join_to_the_full_decode(fixture: str, request: pytest.FixtureRequest) -> None:
    from tokenizers import Tokenizer

    folder: Path = request.getfixturevalue(fixture)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids
    stream = IncrementalDetokenizer(tokenizer)
    pieces = [stream.add(token) for token in ids]
    pieces.append(stream.flush())
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in piece for piece in pieces)
