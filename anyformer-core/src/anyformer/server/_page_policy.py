"""The chat page's Content-Security-Policy: only its own scripts and styles run, and no site may frame it.

The page keeps its script and style inline, so the policy names each inline block by its SHA-256
(computed from the page as served, so it follows every edit of the page): an injected script or
style, an inline event handler or a ``javascript:`` URL does not run, and the page talks only to
the server it came from. ``frame-ancestors 'none'`` and ``X-Frame-Options: DENY`` (for browsers
that predate CSP 2) stop another site from framing it to trick clicks.
"""

from __future__ import annotations

import base64
import hashlib
import re

_INLINE = re.compile(r"<(script|style)(\s[^>]*)?>(.*?)</\1\s*>", re.DOTALL | re.IGNORECASE)


def _digest(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode("utf-8")).digest()).decode("ascii") + "'"


def content_security_policy(page: str) -> str:
    """The policy for ``page``: its inline scripts and styles by hash, anything else from this origin only."""
    scripts: list[str] = []
    styles: list[str] = []
    for tag, attributes, body in _INLINE.findall(page):
        if tag.lower() == "script" and "src=" in (attributes or "").lower():
            continue  # an external script: 'self' covers it
        (scripts if tag.lower() == "script" else styles).append(_digest(body))
    return "; ".join(
        [
            "default-src 'none'",
            " ".join(["script-src 'self'", *scripts]),
            " ".join(["style-src 'self'", *styles]),
            "img-src 'self' data: blob:",
            "media-src 'self' data: blob:",
            "connect-src 'self'",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    )


def page_headers(page: str) -> dict[str, str]:
    """The security headers the chat page is sent with."""
    return {
        "Content-Security-Policy": content_security_policy(page),
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
