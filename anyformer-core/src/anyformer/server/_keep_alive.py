"""How long an idle model stays loaded: durations as Ollama writes them, and the timer that disposes it.

``--keep-alive`` and a request's ``keep_alive`` take a duration (``"5m"``, ``"30s"``, ``"1h30m"``,
``"250ms"``), a number of seconds (``300``, ``"300"``), a negative value (stay loaded until the
server stops or another model needs the room) or ``0`` (unload as soon as the request ends).
The latest request's value decides, as in Ollama.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode

#: How long an idle model stays loaded unless told (Ollama's default).
DEFAULT_KEEP_ALIVE = 300.0
#: A keep-alive that never runs out.
FOREVER = math.inf
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_keep_alive(value: Any, what: str = "keep_alive") -> float:
    """Seconds an idle model stays loaded (:data:`FOREVER` for a negative value); ``BAD_REQUEST`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _bad(what, value)
    if isinstance(value, str):
        text = value.strip().lower()
        negative = text.startswith("-")
        body = text[1:] if negative else text
        try:
            seconds = float(body)
        except ValueError:
            seconds = _duration_seconds(body, what, value)
        else:
            if not math.isfinite(seconds):
                raise _bad(what, value)
        return FOREVER if negative and seconds > 0 else seconds
    if not math.isfinite(value):
        raise _bad(what, value)
    return FOREVER if value < 0 else float(value)


def request_keep_alive(body: Any) -> float | None:
    """A request body's ``keep_alive`` in seconds, None when it gives none."""
    if not isinstance(body, dict) or body.get("keep_alive") is None:
        return None
    return parse_keep_alive(body["keep_alive"])


def _duration_seconds(text: str, what: str, original: Any) -> float:
    parts = _DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise _bad(what, original)
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def _bad(what: str, value: Any) -> AnyformerError:
    shown = repr(value)[:60]
    return AnyformerError(
        ErrorCode.BAD_REQUEST,
        f"{what} must be a duration such as 5m, 30s or 1h30m, a number of seconds, -1 (stay loaded) "
        f"or 0 (unload after the request); got {shown}",
    )


def describe_keep_alive(seconds: float) -> str:
    """A keep-alive as people read it: ``forever``, ``0s``, ``3s``, ``5m``, ``1h30m``."""
    if seconds == FOREVER:
        return "forever"
    whole = round(seconds)
    if whole != seconds or whole < 60:
        return f"{seconds:g}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n)


class IdleTimer:
    """One model's countdown: started when its last request ends, stopped when the next one comes.

    ``expire`` is a coroutine function the timer runs on the event loop when the time runs out;
    ``expires_at`` is the wall-clock time (``time.time()``) at which it will, None while no countdown runs.
    """

    def __init__(self, expire: Callable[[], Any]) -> None:
        self._expire = expire
        self._handle: asyncio.TimerHandle | None = None
        self.expires_at: float | None = None

    def start(self, seconds: float) -> None:
        """Count down ``seconds`` from now (a running countdown is replaced); :data:`FOREVER` counts nothing."""
        self.stop()
        if seconds == FOREVER:
            return
        self.expires_at = time.time() + seconds
        self._handle = asyncio.get_running_loop().call_later(seconds, self._fire)

    def stop(self) -> None:
        """Cancel the countdown (a request came, or the model left for another reason)."""
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
        self.expires_at = None

    def _fire(self) -> None:
        self._handle = None
        self.expires_at = None
        asyncio.get_running_loop().create_task(self._expire())
