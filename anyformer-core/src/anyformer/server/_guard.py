"""Browsers on other sites cannot drive the server: ``Host``, ``Origin`` and ``Content-Type`` are checked.

A web page can send a "simple" request (``text/plain``, no preflight) to ``127.0.0.1``, and a
rebinding DNS name can make a page's own origin point at it. So, before any route runs:

- ``Host`` must be a loopback name (``localhost``, ``*.localhost``, ``127.x.x.x``, ``::1``), the
  address the server is bound to, or a name the operator allowed (``--allowed-host``; ``*`` allows
  any). A rebinding name is none of these: 403.
- An ``Origin`` header must be the server's own (the chat page's) or one the operator allowed with
  ``--cors-origin``: any other is 403. Clients that are not browsers send no ``Origin``.
- A ``POST`` must say ``Content-Type: application/json``: the simple types a page can send without
  a preflight (``text/plain``, forms) are 415. The routes OpenAI defines as uploads (:data:`FORM_PATHS`)
  also take ``multipart/form-data``; a foreign page's form still fails the ``Origin`` check.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from anyformer.server._errors import ApiError, error_response

#: Routes whose POST body is a multipart form (an uploaded file), as OpenAI's API has them.
FORM_PATHS = frozenset({"/v1/audio/transcriptions"})
#: Host names that always mean this machine.
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "[::]"})


def host_name(header: str) -> str:
    """The name in a ``Host`` header, lower-case, without its port (``[::1]:8000`` -> ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    if header.count(":") == 1:
        return header.split(":", 1)[0]
    return header.rstrip(".")


def is_loopback(name: str) -> bool:
    """True for a loopback name or address."""
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class RequestGuard:
    """The ASGI middleware that applies the module's three rules to every HTTP request."""

    def __init__(
        self,
        app: Callable[..., Awaitable[None]],
        *,
        allowed_hosts: Sequence[str] = (),
        cors_origins: Sequence[str] = (),
        bind_host: str | None = None,
    ) -> None:
        self.app = app
        self._any_host = "*" in allowed_hosts
        self._hosts = {host_name(h) for h in allowed_hosts if h != "*"}
        if bind_host and bind_host.lower() not in _WILDCARD_BINDS:
            self._hosts.add(host_name(bind_host) if not bind_host.count(":") > 1 else bind_host.lower())
        self._origins = {origin.rstrip("/").lower() for origin in cors_origins}

    def host_allowed(self, header: str | None) -> bool:
        """Whether a ``Host`` header names this server (no header: a client that is not a browser)."""
        if header is None or self._any_host:
            return True
        name = host_name(header)
        return is_loopback(name) or name in self._hosts

    def origin_allowed(self, origin: str, host: str | None, scheme: str) -> bool:
        """Whether a request from ``origin`` may reach the server: its own origin, or one the operator named."""
        origin = origin.strip().rstrip("/").lower()
        if origin in self._origins:
            return True
        return host is not None and origin == f"{scheme}://{host.strip().lower()}"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await error_response(refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Any, headers: dict[str, str]) -> ApiError | None:
        host = headers.get("host")
        if not self.host_allowed(host):
            return ApiError(
                403,
                "FORBIDDEN_HOST",
                f"Host {host!r:.100} is not a name of this server; the operator may allow it with --allowed-host",
            )
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin, host, scope.get("scheme", "http")):
            return ApiError(
                403,
                "FORBIDDEN_ORIGIN",
                f"requests from {origin!r:.100} are refused; the operator may allow an origin with --cors-origin",
            )
        if scope["method"] == "POST":
            media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media != "application/json" and not (media == "multipart/form-data" and scope["path"] in FORM_PATHS):
                return ApiError(
                    415,
                    "UNSUPPORTED_MEDIA_TYPE",
                    f"a POST body must be sent with Content-Type: application/json, not {media or 'none'!r:.60}",
                )
        return None
