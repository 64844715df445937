"""The Ling (``bailingmoe`` / ``bailingmoe2``) and Qwen3.5 (``qwen35``) pre-tokenizers against llama.cpp's, on the
vocabulary of test_tokenizer_lfm2 whose merges join only across boundaries some expressions draw."""

from __future__ import annotations

import pytest
from test_tokenizer_lfm2 import CORPUS, MERGES, _kv, _tokens
from vocab_gguf import vocab_only_llama

from anyformer_gguf_gpu.testing import byte_level_alphabet
from anyformer_gguf_gpu.tokenizer import GGUFTokenizer

_BYTE = byte_level_alphabet()
# Merges across the combining mark U+0301 (bytes CC 81) after a letter: only a split that keeps the mark with
# the letter (qwen35's) lets them apply.
MARK_MERGES = [*MERGES, f"e {_BYTE[0xCC]}", f"e{_BYTE[0xCC]} {_BYTE[0x81]}"]


def _mark_tokens() -> list[str]:
    return [*_tokens(), f"e{_BYTE[0xCC]}", f"e{_BYTE[0xCC]}{_BYTE[0x81]}"]


# Newline runs among spaces (where Ling's expression is written differently from qwen2's) and combining marks
# after letters and after punctuation (where Qwen3.5's differs).
LING_CORPUS = [*CORPUS, "a \n \n\n b", "x\n\n\ny", " \r\n \n", "e\u0301t\u00e9 (\u0301x) !\u0308a", "नमस्ते दुनिया"]


@pytest.fixture(scope="module", params=["bailingmoe", "bailingmoe2", "qwen35"])
def llama(request, tmp_path_factory):
    """llama.cpp on a vocabulary-only GGUF whose pre-tokenizer is ``request.param`` (the architecture does not
    matter to a vocabulary-only load)."""
    kv = {**_ling_kv(request.param), "tokenizer.ggml.add_bos_token": False}
    return request.param, vocab_only_llama(tmp_path_factory.mktemp("ling-vocab"), kv)


def _ling_kv(pre: str) -> dict[str, object]:
    return {**_kv(_mark_tokens()), "tokenizer.ggml.merges": MARK_MERGES, "tokenizer.ggml.pre": pre}


def test_ling_and_qwen35_split_like_llama_cpp(llama):
    pre, llm = llama
    ours = GGUFTokenizer({**_ling_kv(pre), "tokenizer.ggml.add_bos_token": False})
    for text in LING_CORPUS:
        expected = llm.tokenize(text.encode(), add_bos=False, special=False)
        assert ours.encode(text, add_special=False, parse_special=False) == expected, repr(text)


def test_qwen2s_split_differs_from_qwen35s_on_combining_marks():
    """The corpus tells qwen35 apart from qwen2: a qwen2 split of the mark strings gives other pieces."""
    from anyformer_gguf_gpu.tokenizer import PRE_TOKENIZERS

    def pieces(pre: str, text: str) -> list[str]:
        from tokenizers import Regex, pre_tokenizers

        split = pre_tokenizers.Split(Regex(PRE_TOKENIZERS[pre].expressions[0]), "isolated")
        return [piece for piece, _ in split.pre_tokenize_str(text)]

    marked = LING_CORPUS[-2]
    assert pieces("qwen35", marked) != pieces("qwen2", marked)
