"""Structured output for any backend that picks tokens from logits: a :class:`Constraint` as a token mask.

llguidance (the library llama.cpp's ``--grammar`` path and vLLM use) compiles the JSON schema,
regex or grammar against a vocabulary; each step it says which tokens keep the reply inside the
language, and the sampler sets every other token's logit to -inf before it chooses. llguidance
rather than xgrammar: it builds its tokenizer from a Hugging Face ``tokenizer.json`` (which every
backend here has, or builds from a GGUF, as anyformer-gguf-gpu's tokenizer does) or straight from
llama.cpp's vocabulary (xgrammar needs the Hugging Face tokenizer, which a GGUF does not ship),
computes a mask in microseconds to tenths of a millisecond without precompiling the grammar, and
takes Lark and GBNF grammars as well as JSON schemas and regexes.

llguidance (and numpy) are optional: a backend names the extra that installs them, and without them
a constraint is refused with that name (``BAD_REQUEST``), before any token.

A backend keeps one :class:`ConstraintVocabulary` per model (built on first use: about a second for
a 50k vocabulary) and asks it for a :class:`TokenMask` per stream; the sampler calls
:meth:`TokenMask.apply` on the logits before it chooses, :meth:`TokenMask.consume` with the token it
emits, and ends the reply when :attr:`TokenMask.finished` (the value is complete).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any

from anyformer.contract._constraint import Constraint
from anyformer.contract._errors import AnyformerError, ErrorCode

if TYPE_CHECKING:
    import numpy as np

#: JSON is written compactly with one space after ``,`` and ``:``: flexible whitespace lets a small model
#: write newlines until it runs out of tokens.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _llguidance(install: str) -> Any:
    """The llguidance module, or ``BAD_REQUEST`` naming how to install it."""
    try:
        import llguidance
    except ImportError:
        why = f"constraint: structured output needs llguidance, which is not installed ({install})"
        raise AnyformerError(ErrorCode.BAD_REQUEST, why) from None
    return llguidance


def grammar_of(constraint: Constraint) -> str:
    """The llguidance grammar of a constraint (not yet checked against a vocabulary); needs llguidance."""
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


def _tokenizer_json(tokenizer: Any) -> str:
    """The ``tokenizer.json`` text of a ``tokenizers.Tokenizer``, a transformers fast tokenizer, or that text."""
    if isinstance(tokenizer, str):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)  # transformers' fast tokenizers wrap the Rust one
    if backend is not None:
        tokenizer = backend
    to_str = getattr(tokenizer, "to_str", None)
    if to_str is None:
        raise TypeError(f"not a Hugging Face fast tokenizer: {type(tokenizer).__name__}")
    return str(to_str())


class _TokenTexts:
    """A vocabulary as llguidance's ``TokenizerWrapper`` reads it: each token's bytes, its specials, an encoder.

    For tokenizers whose decoder llguidance does not read from ``tokenizer.json`` (a character
    vocabulary fused by ``Fuse``, WordPiece): a token's bytes are its text decoded alone, right where
    tokens are whole characters or words (a byte-level vocabulary goes through ``tokenizer.json``).
    Special tokens are marked with a leading 0xFF byte, as llguidance expects: text never spells them.
    """

    def __init__(self, tokenizer: Any, ends: list[int]) -> None:
        tok = getattr(tokenizer, "backend_tokenizer", tokenizer)
        special = {i: t.content for i, t in tok.get_added_tokens_decoder().items() if t.special}
        size = tok.get_vocab_size(with_added_tokens=True)
        self.tokens = [
            b"\xff" + special[i].encode() if i in special else tok.decode([i], skip_special_tokens=False).encode()
            for i in range(size)
        ]
        self.special_token_ids = sorted(special)
        self.eos_token_id = ends[0] if ends else None
        self.bos_token_id = None
        self._tok = tok

    def __call__(self, text: str) -> list[int]:
        """The token ids of ``text`` (no special tokens added)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)


class ConstraintVocabulary:
    """llguidance's view of one model's vocabulary, built on first use and kept with the model (thread-safe).

    ``n_vocab`` is the length of the logits rows the sampler masks where the backend knows it (None:
    the tokenizer's own size; a row longer than the vocabulary, as a padded embedding table makes it,
    has its extra tokens masked out either way). ``install`` says how to get llguidance
    (``"pip install 'anyformer-onnx[constrained]'"``): the refusal quotes it. Build one with
    :meth:`from_tokenizer`, or with :meth:`from_builder` from an ``LLTokenizer`` made otherwise
    (llama.cpp's own vocabulary).
    """

    def __init__(self, build: Callable[[], Any], n_vocab: int | None, install: str) -> None:
        self._build = build
        self.n_vocab = n_vocab
        self.install = install
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_builder(cls, build: Callable[[], Any], *, n_vocab: int, install: str) -> ConstraintVocabulary:
        """A vocabulary whose ``LLTokenizer`` ``build()`` makes (called once, at the first constraint)."""
        return cls(build, n_vocab, install)

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, *, n_vocab: int | None = None, end_ids: Iterable[int], install: str
    ) -> ConstraintVocabulary:
        """A vocabulary from a Hugging Face fast tokenizer (``tokenizers.Tokenizer``, transformers' fast
        tokenizer, or ``tokenizer.json``'s text); ``end_ids`` are the tokens that end a reply (EOS, a chat
        model's end of turn): the constraint allows them once the value is complete."""
        ends = sorted(set(end_ids))

        def build() -> Any:  # serialised here, not at load: a 256k vocabulary's JSON is tens of megabytes
            llguidance = _llguidance(install)
            try:
                return llguidance.LLTokenizer(_tokenizer_json(tokenizer), n_vocab=n_vocab, eos_token=ends or None)
            except ValueError as exc:  # a decoder llguidance does not know (Fuse, WordPiece): each token's own text
                try:
                    wrapper = llguidance.TokenizerWrapper(_TokenTexts(tokenizer, ends))
                    return llguidance.LLTokenizer(wrapper, n_vocab=n_vocab, eos_token=ends or None)
                except (ValueError, TypeError, AttributeError):
                    why = f"constraint: llguidance cannot read this model's tokenizer ({exc})"
                    raise AnyformerError(ErrorCode.BAD_REQUEST, why) from None

        return cls(build, n_vocab, install)

    def tokenizer(self) -> Any:
        """The ``LLTokenizer`` (built once, under a lock: two first streams build it once)."""
        with self._lock:
            if self._tokenizer is None:
                _llguidance(self.install)
                with warnings.catch_warnings():  # llama.cpp's builder reads token attributes through a deprecated alias
                    warnings.simplefilter("ignore", DeprecationWarning)
                    self._tokenizer = self._build()
            return self._tokenizer

    def mask_for(self, constraint: Constraint) -> TokenMask:
        """A fresh mask for one stream; ``BAD_REQUEST`` when the constraint does not compile or llguidance
        is missing."""
        llguidance = _llguidance(self.install)
        tokenizer = self.tokenizer()
        grammar = grammar_of(constraint)
        problem = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if problem:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"constraint: the {constraint.kind} is not usable: {problem}")
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"constraint: {matcher.get_error()}")
        return TokenMask(matcher, int(tokenizer.vocab_size))


class TokenMask:
    """One stream's matcher: which tokens may come next, and the tokens taken so far.

    ``n_vocab`` is the vocabulary's size; logits rows may be longer (the tokens past it are never
    allowed). Its buffers are made once per stream: the bitmask llguidance writes (32 tokens a word)
    and the row :meth:`masked` writes.

    The mask of the next step depends only on the tokens consumed so far, so a backend may have it
    computed while its model computes the logits: :meth:`compute_ahead` hands the work to an
    executor (llguidance releases the GIL), and the next :meth:`bitmask` waits for it. That pays where
    a core is free during the model's step (a GPU decode, fewer decode threads than cores); where
    the decode threads take every core it only takes one from them.
    """

    def __init__(self, matcher: Any, n_vocab: int) -> None:
        import numpy as np

        self._matcher = matcher
        self.n_vocab = n_vocab
        self._bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
        self._work = np.empty(n_vocab, dtype=np.float32)
        self._fresh = False  # whether _bits holds the mask after the last consumed token
        self._ahead: Future[None] | None = None  # the mask being computed by compute_ahead
        # Read once per token, not from the matcher: it is not to be touched while compute_ahead works on it.
        self._stopped = bool(matcher.is_stopped())

    @property
    def finished(self) -> bool:
        """True when only the end may follow (the value is complete)."""
        return self._stopped

    def bitmask(self) -> np.ndarray:
        """The allowed tokens as llguidance's int32 words (bit ``i % 32`` of word ``i // 32``); computed once
        per step, the same array every step (copy it to keep it)."""
        self._wait()
        if not self._fresh:
            self._compute()
        return self._bits

    def compute_ahead(self, executor: Executor) -> None:
        """Start computing the next step's mask on ``executor``; the next :meth:`bitmask` (or
        :meth:`consume`) waits for it. Nothing to do when the value is complete."""
        self._wait()
        if not self._fresh and not self._stopped:
            self._ahead = executor.submit(self._compute)

    def _compute(self) -> None:
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        self._fresh = True

    def _wait(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.result()  # a failure in the worker is raised here, in the stream's thread

    def allowed(self, length: int | None = None) -> np.ndarray:
        """A boolean per token of a logits row of ``length`` (default: the vocabulary's size): True where the
        token keeps the reply in the language; tokens past the vocabulary are False."""
        import numpy as np

        length = self.n_vocab if length is None else length
        bits = self.bitmask().view(np.uint8)
        if length <= 8 * bits.size:
            return np.unpackbits(bits, bitorder="little", count=length).view(np.bool_)
        row = np.zeros(length, dtype=np.bool_)
        row[: 8 * bits.size] = np.unpackbits(bits, bitorder="little").view(np.bool_)
        return row

    def masked(self, logits: np.ndarray) -> np.ndarray:
        """The logits with every token the language does not allow next at -inf, in the mask's own float32
        row (reused next step; ``logits`` is not written). Allowed tokens are copied over a row of -inf:
        no index arrays, about 12 µs for 49k tokens."""
        import numpy as np

        self._check_shape(logits)
        if self._work.shape != logits.shape:
            self._work = np.empty(logits.shape, dtype=np.float32)
        work = self._work
        work.fill(-np.inf)
        np.copyto(work, logits, where=self.allowed(logits.shape[0]), casting="same_kind")
        return work

    def apply(self, logits: np.ndarray) -> None:
        """Set every token the language does not allow next to -inf in ``logits`` itself."""
        import numpy as np

        self._check_shape(logits)
        np.copyto(logits, -np.inf, where=~self.allowed(logits.shape[0]))

    def consume(self, token: int) -> None:
        """Advance past the emitted token; a token the mask allowed never fails (``PLUGIN_ERROR`` if it does)."""
        self._wait()  # the matcher is not to be advanced while a mask is computed from it
        self._fresh = False
        if not self._matcher.consume_token(token) or self._matcher.is_error():
            raise AnyformerError(
                ErrorCode.PLUGIN_ERROR, f"the constraint refused token {token} it allowed: {self._matcher.get_error()}"
            )
        self._stopped = bool(self._matcher.is_stopped())

    def _check_shape(self, logits: np.ndarray) -> None:
        if logits.ndim != 1 or logits.shape[0] < self.n_vocab:
            raise AnyformerError(
                ErrorCode.PLUGIN_ERROR, f"a logits row of shape {logits.shape} for a mask of {self.n_vocab} tokens"
            )
