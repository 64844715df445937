"""The prompt a conversation becomes, and the reply a person sees (reasoning left out).

The whole conversation goes through the model's chat template (ChatML when it has none), rendered in
anyformer's sandbox. A reasoning model's ``<think>…</think>`` part is not shown: while the reply
settles, text from an open ``<think>`` on is held back, as is a tail that may yet become one, so
streamed text never has to be taken back.
"""

from __future__ import annotations

from collections.abc import Sequence

from anyformer.plugin import Message, render_chat
from anyformer_kohra.text_codec import TextCodec

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def render_prompt(codec: TextCodec, messages: Sequence[Message], *, thinking: bool) -> list[int]:
    """The prompt's token ids: the conversation in the model's chat template, ready for the answer."""
    text = render_chat(
        codec.chat_template,
        messages,
        add_generation_prompt=True,
        bos_token=codec.bos_token,
        eos_token=codec.eos_token,
        enable_thinking=thinking,
    )
    return codec.encode(text)


def visible_reply(text: str, *, final: bool) -> str:
    """``text`` without its reasoning; unless ``final``, also without a tail that could still start a tag."""
    shown: list[str] = []
    rest = text
    while True:
        start = rest.find(THINK_OPEN)
        if start < 0:
            break
        shown.append(rest[:start])
        end = rest.find(THINK_CLOSE, start + len(THINK_OPEN))
        if end < 0:
            return "".join(shown)
        rest = rest[end + len(THINK_CLOSE) :].lstrip("\n")
    if not final:
        for cut in range(min(len(THINK_OPEN), len(rest)), 0, -1):
            if THINK_OPEN.startswith(rest[-cut:]) or THINK_CLOSE.startswith(rest[-cut:]):
                rest = rest[:-cut]
                break
        # A byte-level tokenizer decodes half a character as U+FFFD until the rest arrives.
        rest = rest.rstrip("\ufffd")
    return "".join(shown) + rest
