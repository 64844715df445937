"""Structured output in llama.cpp: the model's own vocabulary as llguidance reads it.

The constraint's compiling, masking and advancing are the core's (``anyformer.plugin``'s
:class:`ConstraintVocabulary` and :class:`TokenMask`); what is llama.cpp's is the vocabulary: read
once per model from ``llama_vocab`` (a GGUF ships no ``tokenizer.json``), with every
end-of-generation token (a chat model's ``<|im_end|>``, not only EOS) allowed to end the value.
"""

from __future__ import annotations

from typing import Any

from anyformer.plugin import ConstraintVocabulary

#: llguidance is a dependency of this distribution: a missing one is a broken install.
_INSTALL = "pip install --force-reinstall anyformer-llamacpp"


def llama_vocabulary(vocab: Any, n_vocab: int) -> ConstraintVocabulary:
    """The constraint vocabulary of a llama.cpp model (built at the first constraint: about a second)."""

    def build() -> Any:
        import llama_cpp
        from llguidance.llamacpp import lltokenizer_from_vocab

        ends = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)]
        return lltokenizer_from_vocab(vocab, n_vocab=n_vocab, eos_token=ends or None)

    return ConstraintVocabulary.from_builder(build, n_vocab=n_vocab, install=_INSTALL)
