"""The Ling (``bailingmoe`` / ``bailingmoe2``) and Qwen3.5 (``qwen35``) pre-tokenizers against llama.cpp's, on the
vocabulary of test_tokenizer_lfm2 whose merges join only across boundaries some expressions draw."""

from __future__ import annotations

import pytest
from test_tokenizer_lfm2 import CORPUS, MERGES, _kv, _tokens

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
    """llama.cpp on a vocabulary-only GGUF whose pre-tokenizer is ``request.param``."""
    llama_cpp = pytest.importorskip("llama_cpp")
    gguf = pytest.importorskip("gguf")
    path = str(tmp_path_factory.mktemp("ling-vocab") / "vocab.gguf")
    tokens = _mark_tokens()
    w = gguf.GGUFWriter(path, "lfm2")  # the architecture does not matter to a vocabulary-only load
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_head_count(1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(request.param)
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(MARK_MERGES)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return request.param, llama_cpp.Llama(model_path=path, n_ctx=64, vocab_only=True, verbose=False)


def test_ling_and_qwen35_split_like_llama_cpp(llama):
    pre, llm = llama
    kv = {**_kv(_mark_tokens()), "tokenizer.ggml.merges": MARK_MERGES, "tokenizer.ggml.pre": pre}
    ours = GGUFTokenizer({**kv, "tokenizer.ggml.add_bos_token": False})
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
