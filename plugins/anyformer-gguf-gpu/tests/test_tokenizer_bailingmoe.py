"""The Ling pre-tokenizer (``bailingmoe`` / ``bailingmoe2`` GGUFs) against llama.cpp's, on the vocabulary of
test_tokenizer_lfm2 whose merges join only across boundaries some expressions draw."""

from __future__ import annotations

import pytest
from test_tokenizer_lfm2 import CORPUS, MERGES, _kv, _tokens

from anyformer_gguf_gpu.tokenizer import GGUFTokenizer

# Newline runs among spaces: where Ling's expression is written differently from qwen2's.
LING_CORPUS = [*CORPUS, "a \n \n\n b", "x\n\n\ny", " \r\n \n"]


@pytest.fixture(scope="module", params=["bailingmoe", "bailingmoe2"])
def llama(request, tmp_path_factory):
    """llama.cpp on a vocabulary-only GGUF whose pre-tokenizer is ``request.param``."""
    llama_cpp = pytest.importorskip("llama_cpp")
    gguf = pytest.importorskip("gguf")
    path = str(tmp_path_factory.mktemp("ling-vocab") / "vocab.gguf")
    tokens = _tokens()
    w = gguf.GGUFWriter(path, "lfm2")  # the architecture does not matter to a vocabulary-only load
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_head_count(1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(request.param)
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return request.param, llama_cpp.Llama(model_path=path, n_ctx=64, vocab_only=True, verbose=False)


def test_ling_splits_like_llama_cpp(llama):
    pre, llm = llama
    ours = GGUFTokenizer({**_kv(_tokens()), "tokenizer.ggml.pre": pre, "tokenizer.ggml.add_bos_token": False})
    for text in LING_CORPUS:
        expected = llm.tokenize(text.encode(), add_bos=False, special=False)
        assert ours.encode(text, add_special=False, parse_special=False) == expected, repr(text)
