"""Structured output in llama.cpp: the model's own vocabulary as llguidance reads it.

The constraint's compiling, masking and advancing are the core's (``anyformer.plugin``'s
:class:`ConstraintVocabulary` and :class:`TokenMask`); what is llama.cpp's is the vocabulary: read
once per model from ``llama_vocab`` (a GGUF ships no ``tokenizer.json``), with every
end-of-generation token (a chat model's ``<|im_end|>``, not only EOS) allowed to end the value;
and when the next mask is computed (:class:`MaskAhead`).
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor, ThreadPoolExecutor
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


class MaskAhead:
    """The one thread of a model that computes a stream's next mask while ``llama_decode`` runs.

    Only where a core is free for it during the decode: with layers on a GPU (the host waits for the
    device) or fewer decode threads than usable cores. Where the decode threads take every core, the
    mask is computed in line: a thread beside them would take a core from ggml's threadpool, whose
    barrier then waits for the thread that lost it, and the step gets slower by as much. Made at the
    first constraint that uses it; :meth:`close` ends it (dispose leaves no thread behind).
    """

    def __init__(self, spare_core: bool) -> None:
        self.spare_core = spare_core
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def executor(self) -> Executor | None:
        """The executor (None where no core is spare)."""
        if not self.spare_core:
            return None
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anyformer-mask")
            return self._executor

    def close(self) -> None:
        """End the thread, after the mask it may be computing."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
