"""Tool calls streamed as OpenAI streams them: the name first, then the arguments as they are decoded.

:class:`ToolCallStream` reads a reply's deltas. Text before a call goes out as content as it
comes, holding back only what may be the start of a marker; from a marker on (or from the reply's
first ``{`` or ``[``) the text is read as calls. A call's first delta carries its ``index``,
``id``, ``type``, ``function.name`` and the arguments so far; each later delta appends the new
arguments text. The arguments are the model's own JSON text, so the fragments add up to exactly
what the whole reply's call holds (:func:`~anyformer.contract._tool_calls.parse_tool_calls`). A
syntax whose arguments are not JSON (Python calls, Gemma 4's values) sends them whole when the
call's text ends.

Each delta re-reads the held calls' text; once it passes 512 characters it is re-read only after
it grew by a sixteenth, so a long call costs a few dozen reads, not one a token.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any

from anyformer.contract._tool_calls import MARKERS, ToolCall, finished_calls, reading_order
from anyformer.contract._tool_syntaxes import CallDraft

#: Below this many held characters the calls are re-read at every delta.
_REREAD_ALWAYS = 512


@dataclasses.dataclass
class _SentCall:
    """What a stream has sent of one call: its id and how much of its arguments."""

    id: str
    name: str
    arguments: str = ""


class ToolCallStream:
    """Splits a reply's deltas into content and OpenAI ``tool_calls`` delta entries."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = list(names)
        self._held = ""
        self._content_sent = False
        self._calls_text: str | None = None  # from the first marker on, once one is seen
        self._read_at = 0  # how long the calls' text was when it was last read
        self._sent: list[_SentCall] = []
        self._last_read: list[CallDraft] | None = None  # what the calls' text read as last time

    def feed(self, delta: str) -> tuple[str, list[dict[str, Any]]]:
        """The content that can go out now, and the ``tool_calls`` entries this delta completes."""
        if self._calls_text is not None:
            self._calls_text += delta
            grown = len(self._calls_text) - self._read_at
            if len(self._calls_text) < _REREAD_ALWAYS or grown * 16 >= len(self._calls_text):
                return self._read_or_release()
            return "", []
        text = self._held + delta
        self._held = ""
        if not self._content_sent and text.lstrip().startswith(("{", "[")):
            self._calls_text = text
            return self._read_or_release()
        if not self._content_sent and not text.strip():
            self._held = text  # leading whitespace: what follows decides
            return "", []
        cut = min((i for i in (text.find(m) for m in MARKERS) if i >= 0), default=-1)
        if cut >= 0:
            self._calls_text = text[cut:]
            out = text[:cut]
            self._content_sent = self._content_sent or bool(out.strip())
            more, entries = self._read_or_release()
            return out + more, entries
        keep = max((_partial(text, marker) for marker in MARKERS), default=0)
        out, self._held = text[: len(text) - keep], text[len(text) - keep :]
        self._content_sent = self._content_sent or bool(out.strip())
        return out, []

    def _read_or_release(self) -> tuple[str, list[dict[str, Any]]]:
        """The new entries; or, when the held text can be no call and none was begun, that text as content.

        A marker in prose ("import functools") then costs a moment's hold, not the rest of the reply.
        """
        entries = self._entries(final=False)
        if self._sent or self._last_read is not None:
            return "", entries
        text, self._calls_text = self._calls_text or "", None
        self._content_sent = True
        more, entries = self.feed(text[1:])  # the marker's first character is text; what follows is read again
        return text[:1] + more, entries

    def finish(self) -> tuple[str, list[dict[str, Any]], list[ToolCall]]:
        """The rest of the content, the last ``tool_calls`` entries, and the calls the reply made.

        When the held text turns out to be no call it comes back as content, as the whole reply
        reads (a JSON call that broke after its name was sent: that header stays the only trace).
        """
        if self._calls_text is None:
            held, self._held = self._held, ""
            return held, [], []
        entries = self._entries(final=True)
        calls = self._final_calls()
        if calls:
            return "", entries, calls
        return self._calls_text, [], []

    def _drafts(self) -> list[CallDraft] | None:
        """The calls read so far: the first syntax that reads some; [] while one may yet; None when none can."""
        text = self._calls_text or ""
        maybe: list[CallDraft] | None = None
        for start, syntax in reading_order(text):
            if start == 0 or not text[:start].strip():
                drafts = syntax.read(text[start + len(syntax.begin) :])
                if drafts:
                    return drafts
                if drafts is not None:
                    maybe = drafts
        return maybe

    def _final_calls(self) -> list[ToolCall] | None:
        drafts = self._drafts()
        calls = finished_calls(drafts, self._names)
        if calls is None:
            return None
        # The ids the stream gave out stay the calls' ids.
        return [
            ToolCall(call.name, call.arguments, self._sent[i].id) if i < len(self._sent) else call
            for i, call in enumerate(calls)
        ]

    def _entries(self, final: bool) -> list[dict[str, Any]]:
        """The ``tool_calls`` delta entries for what the calls' text has added since the last read."""
        self._read_at = len(self._calls_text or "")
        self._last_read = self._drafts()
        drafts = self._last_read or []
        entries: list[dict[str, Any]] = []
        for index, draft in enumerate(drafts):
            if draft.name is None or draft.name not in self._names or not draft.valid:
                break  # a call is sent from its name on, in order; an unknown name waits for the end
            arguments = draft.arguments.rstrip()
            if index == len(self._sent):
                sent = _SentCall(f"call_{uuid.uuid4().hex[:24]}", draft.name)
                self._sent.append(sent)
                entries.append(
                    {
                        "index": index,
                        "id": sent.id,
                        "type": "function",
                        "function": {"name": draft.name, "arguments": arguments},
                    }
                )
                sent.arguments = arguments
                continue
            sent = self._sent[index]
            if arguments.startswith(sent.arguments) and len(arguments) > len(sent.arguments):
                entries.append({"index": index, "function": {"arguments": arguments[len(sent.arguments) :]}})
                sent.arguments = arguments
            if not draft.complete and not final:
                break
        return entries


def _partial(text: str, marker: str) -> int:
    """How many of ``text``'s last characters could begin ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
