"""The GGUF's own tokenizer, built on the ``tokenizers`` library, splitting text as llama.cpp does.

A ``gpt2``-model GGUF carries a byte-level BPE: ``tokenizer.ggml.tokens`` (the vocabulary, in
byte-level spelling), ``tokenizer.ggml.merges`` and ``tokenizer.ggml.token_type``. llama.cpp splits
text into words with regular expressions chosen by ``tokenizer.ggml.pre``, each applied to the
pieces the previous one left (matches and the text between them both kept), then merges inside
each word. The same is a ``tokenizers`` pipeline: one isolating ``Split`` per expression, then the
byte-level alphabet, then BPE. The expressions are facts from llama.cpp's ``llama-vocab.cpp``.

Control tokens (type 3) are special added tokens, split out of the text only when special tokens
are parsed; user-defined tokens (type 4) are always split out, as llama.cpp does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from anyformer.plugin import TOOL_MARKUP, AnyformerError, ConstraintVocabulary, ErrorCode, LazyArray

# The regular expressions of each pre-tokenizer family (llama-vocab.cpp, llm_tokenizer_bpe).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3.5/3.6: qwen2's with combining marks (\p{M}) counted with the letters.
_QWEN35 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclasses.dataclass(frozen=True)
class PreTokenizer:
    """One ``tokenizer.ggml.pre`` family: its expressions in order, and whether whole words skip the merges."""

    expressions: tuple[str, ...]
    ignore_merges: bool = False
    #: llama.cpp's default for adding BOS when ``tokenizer.ggml.add_bos_token`` is absent.
    add_bos: bool = False


_SMOLLM = PreTokenizer((r"\p{N}", _GPT2))
_LLAMA3_PRE = PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2_PRE = PreTokenizer((_QWEN2,))
_GPT2_PRE = PreTokenizer((_GPT2,))
# llama.cpp's DEFAULT pre-tokenizer, for a GGUF that names none (older conversions) or says "default": runs of
# punctuation and the ASCII symbols GPT-2's rule leaves joined, then GPT-2's rule, then digit runs, then the
# runs of three ASCII digits inside them.
_DEFAULT_PRE = PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))

#: ``tokenizer.ggml.pre`` values this module reads (llama.cpp's names for them).
#: A missing ``tokenizer.ggml.pre`` reads as ``default``, as llama.cpp reads it.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": _DEFAULT_PRE,
    "gpt-2": _GPT2_PRE,
    "phi-2": _GPT2_PRE,
    "mpt": _GPT2_PRE,
    "olmo": _GPT2_PRE,
    "jais": _GPT2_PRE,
    "smollm": _SMOLLM,
    "starcoder": _SMOLLM,
    "refact": _SMOLLM,
    "command-r": _SMOLLM,
    "codeshell": _SMOLLM,
    "exaone": _SMOLLM,
    "minerva-7b": _SMOLLM,
    "llama3": _LLAMA3_PRE,
    "llama-v3": _LLAMA3_PRE,
    "llama-bpe": _LLAMA3_PRE,
    "dbrx": _LLAMA3_PRE,
    "smaug-bpe": _LLAMA3_PRE,
    "lfm2": _LLAMA3_PRE,  # LFM2 / LFM2.5: llama.cpp splits them as llama3 (checked in test_tokenizer_lfm2.py)
    "qwen2": _QWEN2_PRE,
    "stablelm2": _QWEN2_PRE,
    # Ling's expression is qwen2's with ``\s*[\r\n]`` for ``\s*[\r\n]+``: the greedy ``\s*`` already takes
    # every newline but the last, so both split alike (checked in test_tokenizer_bailingmoe.py).
    "bailingmoe": _QWEN2_PRE,
    "bailingmoe2": _QWEN2_PRE,
    "qwen35": PreTokenizer((_QWEN35,)),
}

# llama.cpp's token types (llama_token_type).
_CONTROL = 3
_USER_DEFINED = 4


def _as_list(value: Any) -> list[Any]:
    """A header array as a list: the core hands long arrays over as a :class:`LazyArray`, decoded here."""
    if isinstance(value, LazyArray):
        return value.to_list()
    return value if isinstance(value, list) else []


def pre_tokenizer_name(pre: object) -> object:
    """The ``tokenizer.ggml.pre`` value a GGUF's text is split by: ``default`` where the key is missing or empty
    (llama.cpp's reading: older conversions name none), else the value as stored."""
    return "default" if pre is None or pre == "" else pre


def tokenizer_problem(kv: Mapping[str, Any]) -> str | None:
    """Why this GGUF's tokenizer cannot be built here (a one-line reason), or None when it can."""
    model = kv.get("tokenizer.ggml.model")
    if model not in ("gpt2", "gemma4"):
        return f"tokenizer model {model!r} (only byte-level BPE, 'gpt2', and Gemma 4's 'gemma4' are read)"
    pre = pre_tokenizer_name(kv.get("tokenizer.ggml.pre"))
    if model == "gpt2" and pre not in PRE_TOKENIZERS:
        return f"pre-tokenizer {pre!r} is not one this engine splits like llama.cpp"
    tokens, merges = kv.get("tokenizer.ggml.tokens"), kv.get("tokenizer.ggml.merges")
    if not isinstance(tokens, (list, LazyArray)) or not tokens or not isinstance(merges, (list, LazyArray)):
        return "no tokenizer.ggml.tokens / tokenizer.ggml.merges"
    return None


class GGUFTokenizer:
    """Text to token ids and back, as llama.cpp's ``llama_tokenize`` / ``llama_detokenize`` for this GGUF."""

    def __init__(self, kv: Mapping[str, Any]) -> None:
        problem = tokenizer_problem(kv)
        if problem is not None:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"the GGUF's tokenizer: {problem}")
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

        tokens: list[str] = _as_list(kv["tokenizer.ggml.tokens"])
        types: list[int] = _as_list(kv.get("tokenizer.ggml.token_type")) or [1] * len(tokens)
        merges: list[tuple[str, str]] = []
        for merge in _as_list(kv["tokenizer.ggml.merges"]):
            if isinstance(merge, str) and " " in merge:
                left, right = merge.split(" ", 1)
                merges.append((left, right))
        vocab = {text: index for index, text in enumerate(tokens)}
        gemma4 = kv.get("tokenizer.ggml.model") == "gemma4"
        if gemma4:
            pre = _GEMMA4_PRE
            tok = _gemma4_tokenizer(vocab, merges)
        else:
            pre = PRE_TOKENIZERS[str(pre_tokenizer_name(kv.get("tokenizer.ggml.pre")))]
            bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre.ignore_merges, fuse_unk=False)
            tok = Tokenizer(bpe)
            splits = [pre_tokenizers.Split(Regex(expr), behavior="isolated") for expr in pre.expressions]
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
            )
            tok.decoder = decoders.ByteLevel()
        added = [
            AddedToken(tokens[i], special=types[i] == _CONTROL, normalized=False, lstrip=False, rstrip=False)
            for i in range(min(len(tokens), len(types)))
            if types[i] in (_CONTROL, _USER_DEFINED)
        ]
        tok.add_tokens(added)
        #: Gemma 4: the newline-run tokens by text (llama.cpp takes a whole run as one token where there is one).
        self._newline_runs = {t: i for i, t in enumerate(tokens) if t and set(t) == {"\n"}} if gemma4 else {}
        self._tok = tok
        self.vocab_size = len(tokens)
        controls = frozenset(i for i in range(min(len(tokens), len(types))) if types[i] == _CONTROL)
        #: Control tokens a reply's text leaves out; tool-call markup held in one ([TOOL_CALLS], <|tool_call|>…)
        #: stays, since the core reads calls from the text (as llama.cpp's backend keeps it).
        self.control_ids = frozenset(i for i in controls if tokens[i] not in TOOL_MARKUP)
        self.bos_id = _int_or_none(kv.get("tokenizer.ggml.bos_token_id"))
        self.eos_id = _int_or_none(kv.get("tokenizer.ggml.eos_token_id"))
        self.eot_id = _int_or_none(kv.get("tokenizer.ggml.eot_token_id"))
        # llama.cpp adds BOS for Gemma 4 whatever the header says.
        wants_bos = gemma4 or bool(kv.get("tokenizer.ggml.add_bos_token", pre.add_bos))
        self.add_bos = wants_bos and self.bos_id is not None
        self.add_eos = bool(kv.get("tokenizer.ggml.add_eos_token", False)) and self.eos_id is not None
        self.chat_template = kv.get("tokenizer.chat_template")
        self.tokens = tokens

    def constraint_vocabulary(self, install: str) -> ConstraintVocabulary:
        """This vocabulary as the core's constrained decoding reads it (built at the first constraint), the
        stop ids ending a value; ``install`` is how a backend's user gets llguidance."""
        return ConstraintVocabulary.from_tokenizer(self._tok, end_ids=self.stop_ids, install=install)

    @property
    def stop_ids(self) -> frozenset[int]:
        """The ids that end a reply: end of sequence and end of turn."""
        return frozenset(i for i in (self.eos_id, self.eot_id) if i is not None)

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``: as llama.cpp's ``tokenize(text, add_special, parse_special)``."""
        self._tok.encode_special_tokens = not parse_special
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        if self._newline_runs:
            ids = self._whole_newline_runs(ids)
        if add_special and self.add_bos:
            ids = [int(self.bos_id), *ids]  # type: ignore[arg-type]
        if add_special and self.add_eos:
            ids = [*ids, int(self.eos_id)]  # type: ignore[arg-type]
        return ids

    def _whole_newline_runs(self, ids: list[int]) -> list[int]:
        """Each run of newline tokens (one split piece: the pre-tokenizer isolates newline runs) replaced by the
        run's own token where the vocabulary has one, as llama.cpp's Gemma 4 tokenizer does before merging."""
        runs = set(self._newline_runs.values())
        out: list[int] = []
        i = 0
        while i < len(ids):
            j = i
            while j < len(ids) and ids[j] in runs:
                j += 1
            if j == i:
                out.append(ids[i])
                i += 1
                continue
            whole = self._newline_runs.get("".join(self.tokens[k] for k in ids[i:j]))
            out += [whole] if whole is not None else ids[i:j]
            i = j
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``; control tokens render as nothing, as in a chat reply."""
        return str(self._tok.decode([i for i in ids if i not in self.control_ids], skip_special_tokens=False))


#: Gemma 4 splits raw text only into lines and newline runs (its merges run over whole lines).
_GEMMA4_PRE = PreTokenizer(("[^\n]+|[\n]+",), add_bos=True)


def _gemma4_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Any:
    """Gemma 4's SentencePiece-style BPE as llama.cpp runs it: spaces written as ▁, lines and newline runs merged
    over raw UTF-8 characters, a character outside the vocabulary as its ``<0xXX>`` byte tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=False))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(_GEMMA4_PRE.expressions[0]), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class StreamDecoder:
    """Turns ids arriving one by one into text deltas, holding back an incomplete UTF-8 character.

    Byte-level BPE text is the concatenation of its tokens' bytes, so only the ids since the last
    complete character are decoded each time: the work per token stays constant in a long reply.
    """

    def __init__(self, tokenizer: GGUFTokenizer) -> None:
        self.tokenizer = tokenizer
        self.pending: list[int] = []

    def push(self, token: int) -> str:
        """Add one id; return the new text that is safe to show (may be empty)."""
        self.pending.append(token)
        text = self.tokenizer.decode(self.pending)
        if text.endswith("\ufffd"):
            return ""  # the rest of a multi-byte character is still to come
        self.pending = []
        return text

    def flush(self) -> str:
        """Whatever text is still held back (at the end of a reply)."""
        text = self.tokenizer.decode(self.pending) if self.pending else ""
        self.pending = []
        return text
