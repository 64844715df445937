"""One log line per request, and the metrics counted from it, once its response has been sent.

The middleware gives each HTTP request a :class:`~anyformer.server._timings.RequestRecord` (the
generations the request started add their clocks to it), notes the response's status and, for an
error, the ``code`` of its JSON body, and as the last byte goes writes one line to the
``anyformer.server`` logger::

    POST /v1/chat/completions 200 model=smollm2 backend=llamacpp prompt_tokens=31 generated_tokens=12
    ttft_ms=41.2 tok_s=88.0 ms=190.4

``--log-level`` and ``--log-file`` decide where those lines go (:func:`configure_logging`).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.routing import BaseRoute, Match

from anyformer.server._timings import RequestRecord, begin_request, end_request

#: The logger every request line goes to.
LOGGER = logging.getLogger("anyformer.server")
#: The largest error body read back for its code (OpenAI-shaped errors are a few hundred bytes).
_ERROR_BODY_LIMIT = 16 * 1024

Observer = Callable[[str, int, "str | None", RequestRecord], None]


def configure_logging(level: str = "info", log_file: str | None = None) -> None:
    """Send the request lines at ``level`` and above to ``log_file`` (appended) or stderr."""
    handler: logging.Handler = (
        logging.FileHandler(log_file, encoding="utf-8") if log_file else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    LOGGER.handlers[:] = [handler]
    LOGGER.setLevel(level.upper())
    LOGGER.propagate = False


def route_of(routes: Sequence[BaseRoute], scope: dict[str, Any]) -> str:
    """The route template a request matched (``/v1/models/{model_id:path}``), else ``other``: labels stay few."""
    for route in routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return str(getattr(route, "path", "other"))
    return "other"


def log_line(method: str, path: str, status: int, error_code: str | None, record: RequestRecord, seconds: float) -> str:
    """The request's line: method, path, status, then each generation's model, backend, tokens and speed."""
    parts = [method, path, str(status)]
    if error_code:
        parts.append(f"code={error_code}")
    for clock in record.generations:
        parts += [f"model={clock.model}", f"backend={clock.backend}"]
        if clock.prompt_tokens is not None:
            parts.append(f"prompt_tokens={clock.prompt_tokens}")
        parts.append(f"generated_tokens={clock.tokens}")
        if clock.ttft is not None:
            parts.append(f"ttft_ms={clock.ttft * 1000:.1f}")
        if clock.tokens_per_second is not None:
            parts.append(f"tok_s={clock.tokens_per_second:.1f}")
        if clock.error_code and clock.error_code != error_code:
            parts.append(f"stream_error={clock.error_code}")
    parts.append(f"ms={seconds * 1000:.1f}")
    return " ".join(parts)


class RequestObserver:
    """ASGI middleware: a record per request, then one log line and ``observe(route, status, code, record)``."""

    def __init__(
        self, app: Callable[..., Awaitable[None]], routes: Sequence[BaseRoute], observe: Observer | None = None
    ) -> None:
        self.app = app
        self._routes = routes
        self._observe = observe

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        record, token = begin_request()
        status = 500
        error_body = bytearray()
        written = False

        def finish() -> None:
            nonlocal written
            written = True
            code = _error_code(bytes(error_body)) if status >= 400 else None
            LOGGER.info(log_line(scope["method"], scope["path"], status, code, record, time.perf_counter() - started))
            if self._observe is not None:
                self._observe(route_of(self._routes, scope), status, code, record)

        async def watching_send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body":
                if status >= 400 and len(error_body) < _ERROR_BODY_LIMIT:
                    error_body.extend(message.get("body", b""))
                if not message.get("more_body", False) and not written:
                    finish()  # before the last byte goes: a client that has the reply finds it counted
            await send(message)

        try:
            await self.app(scope, receive, watching_send)
        finally:
            end_request(token)
            if not written:  # the client left, or the app failed before its last byte
                finish()


def _error_code(body: bytes) -> str | None:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None
