"""Gemma 4's tokenizer model (``gemma4``: SentencePiece-style BPE over raw UTF-8) against llama.cpp's, on a
vocabulary built to exercise it: ▁ for spaces, merges across them, newline runs, byte fallback."""

from __future__ import annotations

import pytest
from vocab_gguf import vocab_only_llama

from anyformer_gguf_gpu.tokenizer import GGUFTokenizer, StreamDecoder

SPACE = "\u2581"
CHARS = [*"abcdefghijklmnopqrstuvwxyzTHI.,!?'()0123", SPACE, "\n", "é"]
MERGES = [
    f"{SPACE} t", "t h", f"{SPACE}t h", f"{SPACE}th e", "h e", "i s", f"{SPACE} i", f"{SPACE}i s", "\n \n",
    f"{SPACE} {SPACE}", "e r", "a b", "ab c", "1 2", f"! {SPACE}", "é t", "t é",
]  # fmt: skip
CORPUS = [
    "the theme is there",
    "  two  spaces   three",
    "line one\nline two\n\n\nthird\n\n\n\n\n",
    "abc123 12!! ! é été",
    "日本語 😀 emoji",
    " leading and trailing ",
    "\n\nstarts with newlines",
    "<bos>special<eos> inside",
    "",
]


def _tokens() -> list[str]:
    merged = [m.replace(" ", "") for m in MERGES]
    # Three newlines are one token no merge makes: llama.cpp takes such a run whole.
    return ["<pad>", "<eos>", "<bos>", *(f"<0x{b:02X}>" for b in range(256)), *dict.fromkeys(CHARS + merged), "\n" * 3]


def _types(tokens: list[str]) -> list[int]:
    return [3 if t in ("<pad>", "<eos>", "<bos>") else 6 if t.startswith("<0x") else 1 for t in tokens]


def _kv() -> dict[str, object]:
    tokens = _tokens()
    return {
        "tokenizer.ggml.model": "gemma4",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.token_type": _types(tokens),
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": False,  # llama.cpp adds BOS for Gemma 4 all the same
    }


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """llama.cpp on a vocabulary-only GGUF with the ``gemma4`` tokenizer model."""
    kv = {**_kv(), "tokenizer.ggml.scores": [0.0] * len(_tokens())}
    return vocab_only_llama(tmp_path_factory.mktemp("gemma4-vocab"), kv, "gemma4")


@pytest.mark.parametrize("add_special", [True, False], ids=["bos", "no-bos"])
@pytest.mark.parametrize("parse_special", [True, False], ids=["special", "plain"])
def test_gemma4_tokens_match_llama_cpp(llama, add_special, parse_special):
    ours = GGUFTokenizer(_kv())
    for text in CORPUS:
        expected = llama.tokenize(text.encode(), add_bos=add_special, special=parse_special)
        assert ours.encode(text, add_special=add_special, parse_special=parse_special) == expected, repr(text)


def test_gemma4_text_decodes_as_llama_cpp_detokenizes(llama):
    ours = GGUFTokenizer(_kv())
    for text in CORPUS:
        ids = ours.encode(text, add_special=False, parse_special=False)
        assert ours.decode(ids) == llama.detokenize(ids).decode("utf-8", errors="replace"), repr(text)
        stream = StreamDecoder(ours)
        assert "".join(stream.push(i) for i in ids) + stream.flush() == ours.decode(ids)
