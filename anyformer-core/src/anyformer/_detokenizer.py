"""Text from a growing list of token ids, one piece at a time, as a whole decode would give it (any tokenizer
with ``decode(ids, skip_special_tokens=True)``: the `tokenizers` library's and transformers').

Decoding token by token breaks words (SentencePiece's leading spaces, a character split over
byte-level pieces): each step decodes the tokens since the last emitted piece with and without the
new one and emits the difference, holding it back while it ends in an incomplete UTF-8 character
(U+FFFD).
"""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    """Feed token ids with :meth:`add`, which returns new text; :meth:`flush` returns what was held back."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # first token of the context window
        self._read = 0  # tokens whose text has been emitted

    def _decode(self, start: int, end: int) -> str:
        return str(self._tokenizer.decode(self._ids[start:end], skip_special_tokens=True))

    def add(self, token: int) -> str:
        """Add one token; return the text it completes (empty while a character is incomplete)."""
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
