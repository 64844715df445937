"""Server-sent events: a response that streams ``data:`` lines and stops its source when the client leaves.

Starlette's own streaming response may leave the source iterator open after a failed send; this one
always closes it (which cancels the generation behind it), whether the stream ended, the client
disconnected (seen by a failed send or by the ``http.disconnect`` message), or the server stopped.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

#: The line that ends an OpenAI stream.
DONE = b"data: [DONE]\n\n"


def event(data: Any) -> bytes:
    """One SSE event carrying ``data`` as compact JSON."""
    return b"data: " + json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n\n"


class EventStream(Response):
    """A ``text/event-stream`` response over an async iterator of already encoded events."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes]) -> None:
        # No body and so no Content-Length: the length is unknown until the stream ends.
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def watch_disconnect() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(watch_disconnect)
                try:
                    await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                    async for chunk in self._events:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                except OSError:
                    pass  # the client went away mid-send
                group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._events.aclose()  # type: ignore[attr-defined]
