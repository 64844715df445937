"""What a chat reply carries besides its text: ``reasoning_content`` split from ``<think>``, and chat logprobs.

:class:`ReasoningSplitter` reads the reply's deltas as they come. A reply that begins with
``<think>`` (after any whitespace) is reasoning up to ``</think>``: that part goes to
``reasoning_content`` and the rest to ``content``, streamed the same way as it is split whole. A
tag cut across two deltas is held back until it is whole; nothing else is held.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from anyformer.contract._chunk import TokenLogprob
from anyformer.contract._tool_calls import ToolCallStream, parse_tool_calls
from anyformer.contract._tools import check_tools, function_names

OPEN = "<think>"
CLOSE = "</think>"


class ReasoningSplitter:
    """Splits a reply's deltas into ``(reasoning, content)`` pieces."""

    def __init__(self) -> None:
        self._state = "start"  # start: nothing but whitespace yet; then reasoning or content
        self._held = ""
        self._trim = False  # just past a tag: the newlines after it are dropped, in whichever delta they come

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


def split_reasoning(text: str) -> tuple[str, str]:
    """A whole reply as ``(reasoning, content)``: what :class:`ReasoningSplitter` gives streamed, at once."""
    splitter = ReasoningSplitter()
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
    then ``tool_calls``), and carries logprobs when the request asked for them.
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self._top: int | None = options.get("logprobs")
        self._entries: list[TokenLogprob] = []
        self._splitter = ReasoningSplitter()
        tools = check_tools(options.get("tools")) if options.get("tool_choice") != "none" else ()
        self._names = function_names(tools)
        self._calls = ToolCallStream(self._names) if self._names else None

    def add_logprobs(self, entries: Sequence[TokenLogprob]) -> None:
        """Keep a chunk's logprob entries for the whole reply's ``logprobs``."""
        self._entries.extend(entries)

    def logprobs(self) -> dict[str, Any] | None:
        """The whole reply's ``logprobs`` object, or None when the request did not ask for them."""
        return None if self._top is None else chat_logprobs(self._entries, self._top)

    def message(self, text: str, finish: str | None) -> tuple[dict[str, Any], str | None]:
        """The reply's ``message`` and its finish reason."""
        reasoning, content = split_reasoning(text)
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
        self, delta: str, finish: str | None, entries: Sequence[TokenLogprob]
    ) -> list[tuple[dict[str, Any], str | None, dict[str, Any] | None]]:
        """The stream chunks one core chunk becomes: ``(delta, finish_reason, logprobs)`` each."""
        reasoning, content = self._splitter.feed(delta)
        if finish is not None:
            more_reasoning, more_content = self._splitter.finish()
            reasoning, content = reasoning + more_reasoning, content + more_content
        calls: list[dict[str, Any]] = []
        if self._calls is not None:
            content = self._calls.feed(content)
            if finish is not None:
                rest, found = self._calls.finish()
                content += rest
                if found and finish != "cancelled":
                    calls = [call.to_openai(index) for index, call in enumerate(found)]
        piece: dict[str, Any] = {}
        if reasoning:
            piece["reasoning_content"] = reasoning
        if content:
            piece["content"] = content
        logprobs = chat_logprobs(entries, self._top) if self._top is not None and entries else None
        if calls:
            # The text first, then the calls, then the end, as OpenAI streams them.
            out: list[tuple[dict[str, Any], str | None, dict[str, Any] | None]] = []
            if piece or logprobs is not None:
                out.append((piece, None, logprobs))
            return [*out, ({"tool_calls": calls}, None, None), ({}, "tool_calls", None)]
        if not piece and finish is None and logprobs is None:
            return []
        return [(piece, finish, logprobs)]
