"""llama.cpp over a vocabulary-only GGUF written from the tokenizer header values a test gives ``GGUFTokenizer``: the
reference the tokenizer tests compare with, each fact of the vocabulary stated once."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest


def vocab_only_llama(
    folder: Path, kv: Mapping[str, Any], arch: str = "lfm2", arch_keys: Callable[[Any], None] | None = None
) -> Any:
    """``llama_cpp.Llama(vocab_only=True)`` on a GGUF of architecture ``arch`` holding ``kv``'s ``tokenizer.ggml.*``
    values; ``arch_keys(writer)`` adds what llama.cpp requires of that architecture beyond its sizes. Skips the test
    where llama_cpp or gguf is missing."""
    llama_cpp = pytest.importorskip("llama_cpp")
    gguf = pytest.importorskip("gguf")
    path = str(folder / "vocab.gguf")
    tokens = kv["tokenizer.ggml.tokens"]
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_head_count(1)
    if arch_keys is not None:
        arch_keys(w)
    w.add_tokenizer_model(kv["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in kv:
        w.add_tokenizer_pre(kv["tokenizer.ggml.pre"])
    w.add_token_list(tokens)
    if "tokenizer.ggml.scores" in kv:
        w.add_token_scores(kv["tokenizer.ggml.scores"])
    w.add_token_types(kv["tokenizer.ggml.token_type"])
    w.add_token_merges(kv["tokenizer.ggml.merges"])
    w.add_bos_token_id(kv["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(kv["tokenizer.ggml.eos_token_id"])
    if "tokenizer.ggml.add_bos_token" in kv:
        w.add_add_bos_token(kv["tokenizer.ggml.add_bos_token"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return llama_cpp.Llama(model_path=path, n_ctx=64, vocab_only=True, verbose=False)
