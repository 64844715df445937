"""The core's side of every stream: what it enforces whatever the backend does (docs/contract.md, "Streaming").

Text is rebuilt from deltas so it is always cumulative; token counts never decrease and never pass
``max_new_tokens``; stop strings are cut here once for every backend (holding back text that may
be the start of one); ``cancel`` is checked between chunks; and the backend's iterator is always
closed, so its ``finally`` puts the model back in order.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Generator, Iterator
from types import TracebackType
from typing import Any

from anyformer._chat_template import RenderNote, noting_renders
from anyformer.contract._chunk import Chunk, FinishReason, GenerateOptions, TokenLogprob
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._tool_calls import parse_tool_calls
from anyformer.contract._tools import function_names


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters of ``text`` could still grow into a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def _after_reasoning(text: str, note: RenderNote) -> str:
    """The reply past its reasoning (``<think>…</think>``, opened by the reply or by the prompt): where calls are."""
    if note.thinking_opened or text.lstrip().startswith("<think>"):
        return text.split("</think>", 1)[1] if "</think>" in text else ""  # reasoning never closed: no calls
    return text


class CoreStream(Generator[Chunk, None, None]):
    """Wraps a backend's chunk iterator and yields contract-checked chunks.

    It is a generator as callers use one: iterate it, ``close()`` it early, ``cancel()`` it from
    another thread.

    ``release`` runs exactly once when the stream ends, is closed, or is dropped: the loaded
    model's lock is released there. The state lives apart from this wrapper so that no reference
    cycle keeps a dropped stream (``break`` out of a ``for`` loop) alive until the next GC pass.
    """

    def __init__(
        self,
        backend: str,
        source: Iterator[Chunk],
        options: GenerateOptions,
        release: Callable[[], None],
        note: RenderNote | None = None,
    ):
        self._state = _StreamState(backend, source, options, release, note or RenderNote())
        self._iterator: Generator[Chunk, None, None] = self._state.run()
        # Held while the generator runs: a close() from another thread (dispose) must not step into
        # it mid-read, and a read must not start while a close is under way (it then finds the end).
        self._running = threading.Lock()

    def __iter__(self) -> CoreStream:
        return self

    def __next__(self) -> Chunk:
        with self._running:
            return next(self._iterator)

    def send(self, value: None) -> Chunk:
        """Resume the stream (only ``None`` is sent): the next chunk."""
        with self._running:
            return self._iterator.send(value)

    def throw(self, typ: Any, val: Any = None, tb: TracebackType | None = None) -> Chunk:
        """Raise an exception inside the stream; the backend's iterator is closed on the way out."""
        with self._running:
            if val is None and tb is None:
                return self._iterator.throw(typ)
            return self._iterator.throw(typ, val, tb)

    def close(self) -> None:
        """Stop the stream: the backend's iterator is closed and the model is free again.

        ``ValueError`` while another thread is reading it, as a generator raises (``cancel()`` that
        reader instead: it stops at the next token).
        """
        if not self._running.acquire(blocking=False):
            raise ValueError("the stream is being read in another thread; cancel() it instead")
        try:
            self._iterator.close()
        finally:
            self._running.release()
        self._state.finish()

    def cancel(self) -> None:
        """Ask the stream to stop at the next token, from any thread."""
        self._state.cancel()

    def __del__(self) -> None:
        state = getattr(self, "_state", None)
        if state is not None:
            state.finish()


class _StreamState:
    """What one stream has seen so far; ``run`` is the generator behind :class:`CoreStream`."""

    def __init__(
        self,
        backend: str,
        source: Iterator[Chunk],
        options: GenerateOptions,
        release: Callable[[], None],
        note: RenderNote,
    ):
        self._backend = backend
        self._note = note  # what the chat template's render showed (a backend may render at its first token)
        self._source = source
        self._options = options
        self._release: Callable[[], None] | None = release
        self._text = ""  # everything the backend produced
        self._emitted = 0  # how much of it the caller has seen
        self._tokens = 0
        self._prompt_tokens: int | None = None  # the backend's count, once it reports one
        self._cut = False  # a stop string cut the text
        self._logprobs: list[TokenLogprob] = []  # those not yet passed on, each placed at its offset in the text
        self._prompt_logprobs: tuple[TokenLogprob, ...] = ()  # the prompt's, until a chunk carries them

    def cancel(self) -> None:
        """Set the stream's cancel event: the backend stops at its next check."""
        self._options.cancel.set()

    def finish(self) -> None:
        """Close the backend's iterator and release the model, once."""
        release, self._release = self._release, None
        if release is not None:
            try:
                close = getattr(self._source, "close", None)
                if close is not None:
                    close()
            finally:
                release()

    def _chunk(self, upto: int, finish: FinishReason | None, preview: str | None = None) -> Chunk:
        delta = self._text[self._emitted : upto]
        self._emitted = upto
        # A token's entry goes with the chunk its text begins in; past the end (a cut stop string) it is dropped.
        # At the end, tokens that added no text keep their entries too, unless a stop string cut the text there.
        end = upto if finish is not None and not self._cut else upto - 1
        ready = [entry for entry in self._logprobs if entry.offset <= end]
        self._logprobs = [] if finish else self._logprobs[len(ready) :]
        prompt_logprobs, self._prompt_logprobs = self._prompt_logprobs, ()
        return Chunk(
            text=self._text[:upto],
            delta=delta,
            tokens=self._tokens,
            finish_reason=finish.value if finish else None,
            prompt_tokens=self._prompt_tokens,
            preview=preview,
            logprobs=tuple(ready),
            prompt_logprobs=prompt_logprobs,
            thinking_opened=self._note.thinking_opened,
        )

    def _checked_entries(self, entries: Any, field: str) -> tuple[TokenLogprob, ...]:
        if not isinstance(entries, tuple) or not all(isinstance(e, TokenLogprob) for e in entries):
            raise AnyformerError(
                ErrorCode.PLUGIN_ERROR, f"{self._backend}: Chunk.{field} must be a tuple of TokenLogprob"
            )
        return entries

    def _take_prompt_logprobs(self, raw: Chunk) -> None:
        """Keep the prompt's token entries (the first chunk that has them), each placed where its text
        begins in the prompt (its tokens' pieces in order, never past the prompt's end)."""
        entries = self._checked_entries(raw.prompt_logprobs, "prompt_logprobs")
        if not entries or self._prompt_logprobs:
            return
        prompt = self._options.prompt or ""
        placed, offset = [], 0
        for entry in entries:
            placed.append(dataclasses.replace(entry, offset=min(offset, len(prompt))))
            offset += len(entry.token)
        self._prompt_logprobs = tuple(placed)

    def _take_logprobs(self, raw: Chunk) -> None:
        """Keep a chunk's token entries, placed where their text begins (its tokens' pieces in order)."""
        entries = self._checked_entries(raw.logprobs, "logprobs")
        offset = len(self._text)
        for entry in entries:
            self._logprobs.append(dataclasses.replace(entry, offset=min(offset, len(self._text) + len(raw.delta))))
            offset += len(entry.token)

    def run(self) -> Generator[Chunk, None, None]:
        options = self._options
        finish: FinishReason | None = None
        try:
            while True:
                if options.cancel.is_set():
                    finish = FinishReason.CANCELLED
                    break
                try:
                    with noting_renders(self._note):
                        raw = next(self._source)
                except StopIteration:
                    break
                except AnyformerError as exc:
                    if exc.code is ErrorCode.CANCELLED and options.cancel.is_set():
                        finish = FinishReason.CANCELLED  # the backend stopped mid-render or mid-prompt: a cancel
                        break
                    raise
                except MemoryError as exc:
                    raise AnyformerError(
                        ErrorCode.OUT_OF_MEMORY, f"{self._backend}: out of memory while generating", cause=exc
                    ) from exc
                except Exception as exc:  # a backend's bug reaches the caller with a code and its name
                    raise AnyformerError(
                        ErrorCode.PLUGIN_ERROR,
                        f"{self._backend}: generate raised {type(exc).__name__}: {exc}",
                        cause=exc,
                    ) from exc
                if not isinstance(raw, Chunk):
                    raise AnyformerError(
                        ErrorCode.PLUGIN_ERROR, f"{self._backend}: generate yielded {type(raw).__name__}, not a Chunk"
                    )
                if options.logprobs is not None:
                    self._take_logprobs(raw)
                if options.prompt_logprobs:
                    self._take_prompt_logprobs(raw)
                self._text += raw.delta
                if self._prompt_tokens is None and isinstance(raw.prompt_tokens, int) and raw.prompt_tokens >= 0:
                    self._prompt_tokens = raw.prompt_tokens
                self._tokens = min(max(self._tokens, raw.tokens), options.max_new_tokens)
                if options.stop:
                    cut = min((i for i in (self._text.find(s) for s in options.stop) if i >= 0), default=-1)
                    if cut >= 0:
                        self._text = self._text[:cut]
                        self._cut = True
                        finish = FinishReason.STOP
                        break
                if raw.finish_reason is not None:
                    try:
                        finish = FinishReason(raw.finish_reason)
                    except ValueError:
                        raise AnyformerError(
                            ErrorCode.PLUGIN_ERROR,
                            f"{self._backend}: finish_reason {raw.finish_reason!r} is not stop, length or cancelled",
                        ) from None
                    break
                if self._tokens >= options.max_new_tokens:
                    finish = FinishReason.LENGTH
                    break
                visible = len(self._text) - _held_back(self._text, options.stop)
                preview = raw.preview if isinstance(raw.preview, str) else None
                if visible > self._emitted or raw.tokens or preview is not None or self._prompt_logprobs:
                    yield self._chunk(max(visible, self._emitted), None, preview)
            if options.cancel.is_set() and finish is None:
                finish = FinishReason.CANCELLED
            last = self._chunk(len(self._text), finish or FinishReason.STOP)
            if options.tools and finish is not FinishReason.CANCELLED:
                _, calls = parse_tool_calls(_after_reasoning(self._text, self._note), function_names(options.tools))
                if calls:
                    last = dataclasses.replace(
                        last, tool_calls=tuple(calls), finish_reason=FinishReason.TOOL_CALLS.value
                    )
            yield last
        finally:
            self.finish()
