"""The ``lfm2`` pre-tokenizer (LFM2 / LFM2.5 GGUFs) against llama.cpp's, on a vocabulary built to tell splits apart.

The tiny test vocabulary's merges cannot tell most pre-tokenizers apart, so this one has merges
that only join across a boundary some expressions draw and others do not: digit runs (1..3 digits
or any number), upper-case contractions, punctuation before letters, space runs, newlines, and one
token reachable by no merge (taken whole only where whole words skip the merges).
"""

from __future__ import annotations

import pytest
from vocab_gguf import vocab_only_llama

from anyformer_gguf_gpu.testing import byte_level_alphabet
from anyformer_gguf_gpu.tokenizer import PRE_TOKENIZERS, GGUFTokenizer

MERGES = [
    "1 2", "3 4", "12 3", "4 5", "Ġ Ġ", "' s", "' S", "( a", "Ġ t", "h e", "Ġt he", "Ċ Ċ", "Ġ Ċ", "ĠĠ Ġ",
    "a b", "ab c", "! !", "Ġ (", "e r", "r e", "x y",
]  # fmt: skip
CORPUS = [
    "12345 1234 123456789",
    "it's IT'S he's",
    "(abc) (a",
    "the  there   x\n\n  y \n",
    "xyz xyz",
    "Hello!! world",
    " 12 a1234b",
    "tab\t\tx\r\n\r\n",
    "日本語 😀 ١٢٣ ab's",
    "abc123abc",
    "   lead",
    "x   \n  \n",
]


def _tokens() -> list[str]:
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *byte_level_alphabet()]
    tokens += list(dict.fromkeys(m.replace(" ", "") for m in MERGES if m.replace(" ", "") not in tokens))
    return [*tokens, "xyz"]  # reachable by no merge


def _kv(tokens: list[str]) -> dict[str, object]:
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "lfm2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (len(tokens) - 3),
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 2,
    }


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """llama.cpp on a vocabulary-only lfm2 GGUF (no add_bos key: llama.cpp's default for lfm2 applies)."""

    def lfm2_keys(w):
        w.add_feed_forward_length(8)
        w.add_head_count_kv([1])
        w.add_layer_norm_rms_eps(1e-5)
        w.add_shortconv_l_cache(3)

    return vocab_only_llama(tmp_path_factory.mktemp("lfm2-vocab"), _kv(_tokens()), "lfm2", lfm2_keys)


@pytest.mark.parametrize("add_special", [True, False], ids=["bos", "no-bos"])
def test_lfm2_splits_like_llama_cpp(llama, add_special):
    ours = GGUFTokenizer(_kv(_tokens()))
    for text in CORPUS:
        expected = llama.tokenize(text.encode(), add_bos=add_special, special=False)
        assert ours.encode(text, add_special=add_special, parse_special=False) == expected, repr(text)


def test_the_corpus_tells_the_other_splits_apart(llama, monkeypatch):
    """Every other family gets some text wrong here: the agreement above is not an accident of the vocabulary."""
    for name in ("gpt-2", "smollm", "qwen2"):
        monkeypatch.setitem(PRE_TOKENIZERS, "lfm2", PRE_TOKENIZERS[name])
        other = GGUFTokenizer(_kv(_tokens()))
        wrong = [
            t
            for t in CORPUS
            if other.encode(t, add_special=False, parse_special=False)
            != llama.tokenize(t.encode(), add_bos=False, special=False)
        ]
        assert len(wrong) >= 3, name
