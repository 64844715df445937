"""Connections that cost the server nothing they do not pay for: deadlines, a cap, and quiet descriptor shortages.

uvicorn times out an idle keep-alive connection, but not one that is opened and never sends, nor
one that sends its request head a byte at a time: at a 1,024-descriptor limit, 1,100 of those stop
the server. So:

- a request head must arrive whole within :data:`HEADER_SECONDS` of its first byte (or of the
  connection opening); past that the connection is closed (the body has its own deadline, a pause
  of ``BODY_PAUSE_SECONDS`` between parts, enforced where the application reads it);
- at most ``max_connections`` connections are open at once; one more is closed as it opens;
- running out of descriptors (``EMFILE``, ``ENFILE``) is logged once per :data:`SHORTAGE_LOG_SECONDS`
  without a traceback, not once per refused ``accept`` (asyncio already pauses accepting for a second);
- a request with both ``Content-Length`` and ``Transfer-Encoding`` is refused (400) and its
  connection closed, as RFC 9112 section 6.3 asks: two framings are how requests are smuggled.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from anyformer.server._errors import ApiError, error_response

#: Seconds a request head may take to arrive whole.
HEADER_SECONDS = 10.0
#: Connections open at once by default.
DEFAULT_MAX_CONNECTIONS = 512
#: Seconds between two log lines about running out of file descriptors.
SHORTAGE_LOG_SECONDS = 10.0

_log = logging.getLogger("anyformer.server")
_SHORTAGES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def guarded_protocol(
    max_connections: int = DEFAULT_MAX_CONNECTIONS, header_seconds: float = HEADER_SECONDS
) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a request-head deadline and a cap on open connections (pass as ``http=``)."""

    class GuardedH11Protocol(H11Protocol):
        """One connection: closed when its head is late or when it is one too many."""

        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.close()
                return
            self._watch_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch_head()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # arms uvicorn's keep-alive timer for an idle connection
            self._stop_head_timer()

        def _watch_head(self) -> None:
            """Arm the head deadline while a head is awaited with bytes of it here (or none yet), else disarm."""
            awaiting_head = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
            fresh = self.cycle is None  # a new connection: its first head is due from now
            if awaiting_head and (fresh or self.conn.trailing_data[0]):
                if self._head_timer is None:
                    self._head_timer = self.loop.call_later(header_seconds, self._head_late)
            else:
                self._stop_head_timer()

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self.transport.close()

    return GuardedH11Protocol


class DescriptorShortageLog:
    """A loop exception handler: a shortage of descriptors is one line per period, everything else as before."""

    def __init__(self, period: float = SHORTAGE_LOG_SECONDS) -> None:
        self.period = period
        self._last = -float("inf")
        self.suppressed = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if not (isinstance(exc, OSError) and exc.errno in _SHORTAGES):
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - self._last < self.period:
            self.suppressed += 1
            return
        self._last = now
        _log.error(
            "out of file descriptors (%s): new connections wait; %d more such errors were not logged. "
            "Raise the limit (ulimit -n) or lower --max-connections",
            errno.errorcode.get(exc.errno or 0, exc.errno),
            self.suppressed,
        )
        self.suppressed = 0


def install_shortage_log(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop`` log descriptor shortages once per period (called from the application's start-up)."""
    if not isinstance(loop.get_exception_handler(), DescriptorShortageLog):
        loop.set_exception_handler(DescriptorShortageLog())


class AmbiguousFramingGuard:
    """Refuses a request that gives both ``Content-Length`` and ``Transfer-Encoding``, and closes its connection."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            names = {name.lower() for name, _ in scope["headers"]}
            if b"content-length" in names and b"transfer-encoding" in names:
                response = error_response(
                    ApiError(
                        400,
                        "BAD_REQUEST",
                        "the request gives both Content-Length and Transfer-Encoding; send one (RFC 9112 6.3)",
                    )
                )
                response.headers["connection"] = "close"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
