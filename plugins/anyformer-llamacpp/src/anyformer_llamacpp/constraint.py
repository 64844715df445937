"""Structured output in llama.cpp: a :class:`anyformer.Constraint` as a token mask over the model's vocabulary.

llguidance (the library llama.cpp's own ``--grammar`` path and vLLM use) compiles the JSON schema,
regex or grammar against the vocabulary, read once per model from llama.cpp (``TokenVocabulary``);
each step it computes which tokens keep the reply inside the language, and every other token's
logit becomes -inf before the sampler sees it. llguidance rather than xgrammar: it builds its
tokenizer straight from llama.cpp's vocabulary (xgrammar needs the Hugging Face tokenizer, which a
GGUF does not ship), computes a mask in tens to hundreds of microseconds without precompiling the
grammar, and takes Lark and GBNF grammars as well as JSON schemas and regexes.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, Constraint, ErrorCode

#: JSON is written compactly with one space after ``,`` and ``:``: flexible whitespace lets a small model
#: write newlines until it runs out of tokens.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_of(constraint: Constraint) -> str:
    """The llguidance grammar of a constraint (not yet checked against a vocabulary)."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    if constraint.kind == "json_schema":
        try:
            return LLMatcher.grammar_from_json_schema(constraint.source, overrides=_JSON_OPTIONS)  # type: ignore[arg-type]
        except ValueError as exc:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"constraint: the JSON schema is not usable ({exc})") from None
    if constraint.kind == "regex":
        return LLMatcher.grammar_from_regex(constraint.source)
    source = constraint.source
    if constraint.kind == "gbnf":
        try:
            source = any_to_lark(source)
        except Exception as exc:  # the converter raises what its parser meets
            why = f"constraint: the GBNF grammar does not parse ({exc})"
            raise AnyformerError(ErrorCode.BAD_REQUEST, why) from None
    return LLMatcher.grammar_from_lark(source)


class TokenVocabulary:
    """llguidance's view of a llama.cpp vocabulary, built on first use (about a second) and kept with the model."""

    def __init__(self, vocab: Any, n_vocab: int) -> None:
        self._vocab = vocab
        self.n_vocab = n_vocab
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def tokenizer(self) -> Any:
        """The ``LLTokenizer`` (built once, under a lock: two first streams build it once)."""
        with self._lock:
            if self._tokenizer is None:
                import llama_cpp
                from llguidance.llamacpp import lltokenizer_from_vocab

                # Every end-of-generation token ends a constrained reply (a chat model's <|im_end|>, not only EOS).
                ends = [t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t)]
                with warnings.catch_warnings():  # it reads each token's attributes through a deprecated alias
                    warnings.simplefilter("ignore", DeprecationWarning)
                    self._tokenizer = lltokenizer_from_vocab(self._vocab, n_vocab=self.n_vocab, eos_token=ends or None)
            return self._tokenizer

    def mask_for(self, constraint: Constraint) -> TokenMask:
        """A fresh mask for one stream; ``BAD_REQUEST`` when the constraint does not compile."""
        from llguidance import LLMatcher

        grammar = grammar_of(constraint)
        tokenizer = self.tokenizer()
        problem = LLMatcher.validate_grammar(grammar, tokenizer)
        if problem:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"constraint: the {constraint.kind} is not usable: {problem}")
        matcher = LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"constraint: {matcher.get_error()}")
        return TokenMask(matcher, self.n_vocab)


class TokenMask:
    """One stream's matcher: which tokens may come next, and the tokens taken so far."""

    def __init__(self, matcher: Any, n_vocab: int) -> None:
        self._matcher = matcher
        self._n_vocab = n_vocab
        self._bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)

    @property
    def finished(self) -> bool:
        """True when only the end may follow (the value is complete)."""
        return bool(self._matcher.is_stopped())

    def allowed(self) -> np.ndarray:
        """A boolean per token: True where the token keeps the reply in the language."""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little", count=self._n_vocab).view(np.bool_)

    def apply(self, logits: np.ndarray) -> None:
        """Set every token the language does not allow next to -inf, in place."""
        logits[~self.allowed()] = -np.inf

    def consume(self, token: int) -> None:
        """Advance past the emitted token; a token the mask allowed never fails (``PLUGIN_ERROR`` if it does)."""
        if not self._matcher.consume_token(token) or self._matcher.is_error():
            raise AnyformerError(
                ErrorCode.PLUGIN_ERROR, f"the constraint refused token {token} it allowed: {self._matcher.get_error()}"
            )
