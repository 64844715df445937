"""Text from a growing list of token ids, one piece at a time, as a whole decode would give it (any tokenizer
with ``decode(ids, skip_special_tokens=True)``: the `tokenizers` library's and transformers').

Decoding token by token breaks words (SentencePiece's leading spaces, a character split over
byte-level pieces): each step decodes the tokens since the last emitted piece with and without the
new one and emits the difference, holding it back while it ends in an incomplete UTF-8 character
(U+FFFD).
"""

from __future__ import annotations

from typing import Any

from anyformer.contract._tool_syntaxes import TOOL_MARKUP


def _markup_ids(tokenizer: Any) -> dict[int, str]:
    """The special tokens that hold tool-call markup (``[TOOL_CALLS]``, ``<|tool_call|>``…), by id: the core
    reads calls from a reply's text, so they keep their text where other special tokens leave none."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)  # transformers' fast tokenizers wrap the Rust one
    added = getattr(backend, "get_added_tokens_decoder", None)
    if added is None:
        return {}
    return {i: t.content for i, t in added().items() if t.special and t.content in TOOL_MARKUP}


class IncrementalDetokenizer:
    """Feed token ids with :meth:`add`, which returns new text; :meth:`flush` returns what was held back.

    Special tokens leave no text, except those holding tool-call markup (``TOOL_MARKUP``), which keep theirs.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # first token of the context window
        self._read = 0  # tokens whose text has been emitted
        self._markup = _markup_ids(tokenizer)

    def _decode(self, start: int, end: int) -> str:
        return str(self._tokenizer.decode(self._ids[start:end], skip_special_tokens=True))

    def add(self, token: int) -> str:
        """Add one token; return the text it completes (empty while a character is incomplete)."""
        markup = self._markup.get(token)
        if markup is not None:  # what was held back, then the markup; decoding starts again after it
            text = self.flush() + markup
            self._ids.append(token)
            self._prefix = self._read = len(self._ids)
            return text
        self._ids.append(token)
        before = self._decode(self._prefix, self._read)
        after = self._decode(self._prefix, len(self._ids))
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]

    def flush(self) -> str:
        """The text of the tokens not emitted yet (call at the end of a stream)."""
        if self._read == len(self._ids):
            return ""
        before = self._decode(self._prefix, self._read)
        after = self._decode(self._prefix, len(self._ids))
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]
