"""Where each message's text begins in a rendered chat prompt, as token positions.

A chat client or a server sends the same system prompt and earlier turns with every question. The
prompt's batches are cut at these *marks* as well as on the block grid (``prompt_blocks``), so the
cache can be kept up to the start of the newest message's text (its role header included) and not
only up to the last whole block. The marks are a function of the messages alone, so the same
messages are always evaluated in the same batches.

Each message's text is looked for in the rendered prompt, in order, after the previous one; a text
the template changed (not found as written) gives no mark. A mark counts only where a token ends
exactly at it: the token pieces, joined, must spell the rendered prompt.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from anyformer.plugin import Message, text_of


def text_starts(prompt: str, messages: Sequence[Message]) -> list[int]:
    """The character offsets in ``prompt`` where each message's text (stripped) is first found, in order.

    The search for a message starts where the previous message's text ended; an empty text, or one
    not found, is skipped.
    """
    starts: list[int] = []
    cursor = 0
    for message in messages:
        needle = text_of(message["content"]).strip()
        if not needle:
            continue
        found = prompt.find(needle, cursor)
        if found < 0:
            continue
        starts.append(found)
        cursor = found + len(needle)
    return starts


def token_marks(
    prompt: str, tokens: Sequence[int], piece: Callable[[int], bytes], char_starts: Sequence[int], skip: int = 0
) -> list[int]:
    """The token positions where a token boundary falls exactly at one of ``char_starts``.

    ``piece(token)`` is the token's text as bytes (special tokens spelled out); the first ``skip``
    tokens (a BOS the tokenizer added) are not part of ``prompt``. When the pieces do not spell
    ``prompt`` (a tokenizer that normalises its input), there are no marks.
    """
    pieces = [piece(token) for token in tokens[skip:]]
    if b"".join(pieces) != prompt.encode("utf-8"):
        return []
    ends: list[int] = []
    offset = 0
    for text in pieces:
        offset += len(text)
        ends.append(offset)
    marks: list[int] = []
    for start in char_starts:
        byte_start = len(prompt[:start].encode("utf-8"))
        index = bisect.bisect_left(ends, byte_start)
        if index < len(ends) and ends[index] == byte_start:
            marks.append(skip + index + 1)  # the positions before it are tokens[: skip + index + 1]
    return marks
