"""Special tokens in what users write are text: a message cannot forge a turn with ``<|im_start|>``.

A rendered chat prompt is the template's markers around the messages' texts. Tokenized whole with
special tokens parsed (as it must be, for the markers), a user who writes ``<|im_end|>`` or
``<|im_start|>system`` would get the control tokens themselves and could end their turn and begin
one in another role. So the texts of user, system and tool messages that spell a special token are
tokenized apart with special parsing off (llama.cpp's ``parse_special = false``), and the template's
own text around them with it on. A text that spells no special token leaves the prompt tokenized
whole, exactly as before. The ``special_in_content`` load option gives the old parsing back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from anyformer.plugin import AnyformerError, ErrorCode, Message, text_of
from anyformer_llamacpp.load_options import LOAD_OPTIONS

#: The roles whose text is the client's (or a tool's) words, never the template's markers.
CONTENT_ROLES = frozenset({"user", "system", "tool"})

#: ``(text, add_bos, special) -> tokens``: llama.cpp's tokenizer.
Tokenize = Callable[[str, bool, bool], list[int]]


def special_in_content(options: dict[str, object]) -> bool:
    """The ``special_in_content`` load option: parse special tokens in message text too (default off).

    ``BAD_REQUEST`` for anything but a yes or no (the schema in :mod:`anyformer_llamacpp.load_options`).
    """
    return bool(LOAD_OPTIONS.value(options, "special_in_content"))


def text_spans(
    prompt: str, messages: Sequence[Message], spells_special: Callable[[str], bool]
) -> list[tuple[int, int]]:
    """The character spans of ``prompt`` that hold a content message's text spelling a special token.

    Each message's text is looked for after the previous one's, as ``prompt_marks`` does. A text
    that spells a special token but that the template changed (not found as written) cannot be
    kept apart: ``BAD_REQUEST`` rather than a forged control token.
    """
    spans: list[tuple[int, int]] = []
    cursor = 0
    for index, message in enumerate(messages):
        text = text_of(message["content"]).strip()
        if not text:
            continue
        found = prompt.find(text, cursor)
        if message.get("role") in CONTENT_ROLES and spells_special(text):
            if found < 0:
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST,
                    f"messages[{index}] spells one of the model's special tokens and its chat template changes "
                    "the text, so it cannot be kept as plain text",
                )
            spans.append((found, found + len(text)))
        if found >= 0:
            cursor = found + len(text)
    return spans


def content_tokens(prompt: str, spans: Sequence[tuple[int, int]], add_bos: bool, tokenize: Tokenize) -> list[int]:
    """``prompt`` tokenized with special tokens parsed except inside ``spans`` (in order, not overlapping)."""
    if not spans:
        return tokenize(prompt, add_bos, True)
    tokens: list[int] = []
    cursor = 0
    for start, stop in spans:
        if start > cursor or not tokens:
            tokens += tokenize(prompt[cursor:start], add_bos and not tokens, True)
        tokens += tokenize(prompt[start:stop], False, False)
        cursor = stop
    if cursor < len(prompt):
        tokens += tokenize(prompt[cursor:], False, True)
    return tokens
