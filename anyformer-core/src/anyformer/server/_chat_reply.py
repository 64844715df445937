"""What a chat reply carries besides its text: ``reasoning_content`` split from ``<think>``, and chat logprobs.

:class:`ReasoningSplitter` reads the reply's deltas as they come. A reply that begins with
``<think>`` (after any whitespace) is reasoning up to ``</think>``: that part goes to
``reasoning_content`` and the rest to ``content``, streamed the same way as it is split whole. A
reply whose prompt already opened ``<think>`` (``Chunk.thinking_opened``: the template wrote it)
is reasoning from its first character. A tag cut across two deltas is held back until it is
whole; nothing else is held.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from anyformer.contract._chunk import TokenLogprob
from anyformer.contract._tool_calls import parse_tool_calls
from anyformer.contract._tool_stream import ToolCallStream
from anyformer.contract._tools import check_tools, function_names

OPEN = "<think>"
CLOSE = "</think>"


class ReasoningSplitter:
    """Splits a reply's deltas into ``(reasoning, content)`` pieces."""

    def __init__(self, opened: bool = False) -> None:
        # start: nothing but whitespace yet; then reasoning or content. A prompt that opened <think> (the
        # template wrote it: Qwen3 thinking, DeepSeek-R1) has the reply begin inside the reasoning.
        self._state = "reasoning" if opened else "start"
        self._held = ""
        self._trim = opened  # just past a tag: the newlines after it are dropped, in whichever delta they come

    def _trimmed(self, text: str) -> str:
        if self._trim:
            text = text.lstrip("\n")
            self._trim = not text
        return text

    def feed(self, delta: str) -> tuple[str, str]:
        """The reasoning and the content this delta completes (either may be empty)."""
        text = self._held + delta
        self._held = ""
        if self._state == "start":
            stripped = text.lstrip()
            if stripped.startswith(OPEN):
                self._state, self._trim = "reasoning", True
                text = stripped[len(OPEN) :]
            elif OPEN.startswith(stripped):  # empty, whitespace, or the tag cut short: wait for more
                self._held = text
                return "", ""
            else:
                self._state = "content"
        text = self._trimmed(text)
        if self._state == "content":
            return "", text
        end = text.find(CLOSE)
        if end >= 0:
            self._state, self._trim = "content", True
            return text[:end], self._trimmed(text[end + len(CLOSE) :])
        keep = _partial_tail(text, CLOSE)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], ""

    def finish(self) -> tuple[str, str]:
        """What was held back at the end of the reply (a reply of whitespace only stays content)."""
        held, self._held = self._held, ""
        if self._state == "reasoning":
            return held, ""
        return "", held


def _partial_tail(text: str, tag: str) -> int:
    """How many of ``text``'s last characters could begin ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def split_reasoning(text: str, opened: bool = False) -> tuple[str, str]:
    """A whole reply as ``(reasoning, content)``: what :class:`ReasoningSplitter` gives streamed, at once.

    ``opened``: the prompt ended inside ``<think>``, so the reply begins as reasoning.
    """
    splitter = ReasoningSplitter(opened)
    reasoning, content = splitter.feed(text)
    more_reasoning, more_content = splitter.finish()
    return reasoning + more_reasoning, content + more_content


def _alternative(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat_logprobs(entries: Sequence[TokenLogprob], top: int) -> dict[str, Any]:
    """OpenAI's chat ``logprobs`` object: ``{"content": [{token, logprob, bytes, top_logprobs}, ...]}``.

    ``top_logprobs`` lists the ``top`` likeliest tokens at each position (the engine may add the
    chosen one past them; OpenAI gives exactly ``top``).
    """
    return {
        "content": [
            {
                **_alternative(entry.token, entry.logprob if entry.logprob is not None else 0.0),
                "top_logprobs": [_alternative(token, logprob) for token, logprob in entry.top[:top]],
            }
            for entry in entries
        ],
        "refusal": None,
    }


class ChatReply:
    """One chat reply as it is sent: whole (:meth:`message`) or as stream deltas (:meth:`deltas`).

    It splits the reasoning out, reads tool calls when the request gave tools (``finish_reason``
    then ``tool_calls``; streamed as OpenAI streams them, :mod:`anyformer.contract._tool_stream`),
    and carries logprobs when the request asked for them.
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self._top: int | None = options.get("logprobs")
        self._entries: list[TokenLogprob] = []
        self._splitter: ReasoningSplitter | None = None  # made at the first chunk, which says how the prompt ended
        tools = check_tools(options.get("tools")) if options.get("tool_choice") != "none" else ()
        self._names = function_names(tools)
        self._calls = ToolCallStream(self._names) if self._names else None
        self._called = False

    def add_logprobs(self, entries: Sequence[TokenLogprob]) -> None:
        """Keep a chunk's logprob entries for the whole reply's ``logprobs``."""
        self._entries.extend(entries)

    def logprobs(self) -> dict[str, Any] | None:
        """The whole reply's ``logprobs`` object, or None when the request did not ask for them."""
        return None if self._top is None else chat_logprobs(self._entries, self._top)

    def message(self, text: str, finish: str | None, opened: bool = False) -> tuple[dict[str, Any], str | None]:
        """The reply's ``message`` and its finish reason (``opened``: the prompt ended inside ``<think>``)."""
        reasoning, content = split_reasoning(text, opened)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = reasoning
        if self._names and finish != "cancelled":
            rest, calls = parse_tool_calls(content, self._names)
            if calls:
                message["content"] = rest or None
                message["tool_calls"] = [call.to_openai() for call in calls]
                finish = "tool_calls"
        return message, finish

    def deltas(
        self, delta: str, finish: str | None, entries: Sequence[TokenLogprob], opened: bool = False
    ) -> list[tuple[dict[str, Any], str | None, dict[str, Any] | None]]:
        """The stream chunks one core chunk becomes: ``(delta, finish_reason, logprobs)`` each.

        Text before a call goes out as ``content``; each call's name as soon as it is read, then its
        arguments as they are decoded (``tool_calls`` entries); the finish reason comes alone, last.
        """
        if self._splitter is None:
            self._splitter = ReasoningSplitter(opened)
        reasoning, content = self._splitter.feed(delta)
        if finish is not None:
            more_reasoning, more_content = self._splitter.finish()
            reasoning, content = reasoning + more_reasoning, content + more_content
        calls: list[dict[str, Any]] = []
        if self._calls is not None:
            content, calls = self._calls.feed(content)
            if finish is not None:
                rest, last, made = self._calls.finish()
                content += rest
                calls += last
                self._called = bool(made) and finish != "cancelled"
        piece: dict[str, Any] = {}
        if reasoning:
            piece["reasoning_content"] = reasoning
        if content:
            piece["content"] = content
        logprobs = chat_logprobs(entries, self._top) if self._top is not None and entries else None
        if finish is not None and not calls and not self._called:
            return [(piece, finish, logprobs)]
        out: list[tuple[dict[str, Any], str | None, dict[str, Any] | None]] = []
        if piece or logprobs is not None:
            out.append((piece, None, logprobs))
        if calls:
            out.append(({"tool_calls": calls}, None, None))
        if finish is not None:  # after calls, the end comes alone, as OpenAI streams it
            out.append(({}, "tool_calls", None))
        return out
