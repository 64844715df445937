"""When a generation's tokens came: llama-server's ``timings`` object, and what one HTTP request generated.

A :class:`GenerationClock` is written by the thread that reads the backend (one writer) and read
by the event loop once the generation has ended. The request a generation belongs to is found
through a context variable: the request log sets a :class:`RequestRecord` before the route runs,
and :func:`attach_to_request` (called where the pool starts a generation, in that request's
context) adds the clock to it; outside a request nothing is recorded.
"""

from __future__ import annotations

import contextvars
import dataclasses
import time
from typing import Any

from anyformer.contract._errors import AnyformerError


@dataclasses.dataclass
class GenerationClock:
    """One generation's times (``time.perf_counter()`` seconds) and counts.

    ``started`` is when the backend was asked, ``first_token`` when the first chunk with a token
    came, ``last_token`` when the latest did; ``tokens`` is the backend's running count;
    ``error_code`` the code of the error that ended it, if one did.
    """

    model: str = ""
    backend: str = ""
    started: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0
    prompt_tokens: int | None = None
    error_code: str | None = None

    def start(self) -> None:
        """The backend is asked now."""
        self.started = time.perf_counter()

    def chunk(self, tokens: int, prompt_tokens: int | None) -> None:
        """A chunk came with the backend's running token count (and its prompt count, when it gives one)."""
        if prompt_tokens is not None:
            self.prompt_tokens = prompt_tokens
        if tokens > self.tokens:
            now = time.perf_counter()
            if self.first_token is None:
                self.first_token = now
            self.last_token = now
            self.tokens = tokens

    def fail(self, error: BaseException) -> None:
        """The generation ended with ``error`` (its code is counted by the metrics)."""
        self.error_code = error.code.value if isinstance(error, AnyformerError) else "INTERNAL_ERROR"

    @property
    def ttft(self) -> float | None:
        """Seconds from asking the backend to its first token (the prompt's processing), None before one."""
        if self.started is None or self.first_token is None:
            return None
        return self.first_token - self.started

    @property
    def token_gap(self) -> float | None:
        """Mean seconds between generated tokens after the first, None with fewer than two."""
        if self.first_token is None or self.last_token is None or self.tokens < 2:
            return None
        return (self.last_token - self.first_token) / (self.tokens - 1)

    @property
    def tokens_per_second(self) -> float | None:
        """Generated tokens per second after the first token, None with fewer than two."""
        gap = self.token_gap
        return 1.0 / gap if gap else None

    def timings(self) -> dict[str, Any]:
        """llama-server's ``timings``: the prompt's and the prediction's counts, milliseconds and rates.

        ``prompt_ms`` is the time to the first token; ``predicted_ms`` runs from the first token to
        the last, over ``predicted_n - 1`` gaps, as the first token's time is the prompt's.
        """
        prompt_ms = (self.ttft or 0.0) * 1000
        prompt_n = self.prompt_tokens or 0
        gap = self.token_gap
        predicted_ms = (gap * (self.tokens - 1) * 1000) if gap is not None else 0.0
        return {
            "prompt_n": prompt_n,
            "prompt_ms": round(prompt_ms, 3),
            "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else None,
            "prompt_per_second": round(prompt_n / (prompt_ms / 1000), 3) if prompt_n and prompt_ms else None,
            "predicted_n": self.tokens,
            "predicted_ms": round(predicted_ms, 3),
            "predicted_per_token_ms": round(gap * 1000, 3) if gap is not None else None,
            "predicted_per_second": round(1 / gap, 3) if gap else None,
        }


@dataclasses.dataclass
class RequestRecord:
    """What one HTTP request did: its generations' clocks (several for a multi-prompt completion)."""

    generations: list[GenerationClock] = dataclasses.field(default_factory=list)


_CURRENT: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar("anyformer_request", default=None)


def begin_request() -> tuple[RequestRecord, contextvars.Token[RequestRecord | None]]:
    """A fresh record for the request being served in this context; reset the token when it ends."""
    record = RequestRecord()
    return record, _CURRENT.set(record)


def end_request(token: contextvars.Token[RequestRecord | None]) -> None:
    """Forget the record :func:`begin_request` set."""
    _CURRENT.reset(token)


def attach_to_request(clock: GenerationClock) -> None:
    """Add ``clock`` to the request being served in this context (nothing outside a request)."""
    record = _CURRENT.get()
    if record is not None:
        record.generations.append(clock)
