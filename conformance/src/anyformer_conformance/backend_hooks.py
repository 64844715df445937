"""A backend's own hooks and its handle's ``generate``, called with nothing of the core in between.

The core clamps what a backend does (token counts, the stream's end, verdicts that break the
``need`` rule), so a bug it hides never shows through ``anyformer.load`` or ``anyformer.check``.
The kit calls the backend here instead: :class:`BackendHooks` registers the plugin object alone in
a bare pluggy manager with anyformer's hook specifications and calls a handle's ``generate``
itself, and :func:`read_backend_stream` reads that iterator to its very end, bounded by a chunk
count and a time limit.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable
from typing import Any

import pluggy

from anyformer import Caps, GenerateOptions, Model, Request, hookspecs
from anyformer.plugin import Message

__all__ = ["BackendHooks", "BackendStream", "read_backend_stream"]


class BackendHooks:
    """The hooks of one plugin object, called directly: whatever they return or raise comes back unchanged.

    Each hook's implementation is called as the core calls it (with the arguments it names), not
    through pluggy's hook caller, so a change to the specs' ``firstresult`` does not change what
    comes back.
    """

    def __init__(self, plugin: object, backend_id: str) -> None:
        self.backend_id = backend_id
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._pm.register(plugin, name=backend_id)

    def _call(self, hook: str, **arguments: Any) -> Any:
        """The plugin's implementation of ``hook`` called with the arguments it takes; None when it has none."""
        implementations = getattr(self._pm.hook, hook).get_hookimpls()
        if not implementations:
            return None
        implementation = implementations[0]  # one plugin is registered: at most one implementation
        return implementation.function(*(arguments[name] for name in implementation.argnames))

    def can_run(self, model: Model, caps: Caps, request: Request) -> Any:
        """The backend's raw ``can_run`` answer (None when it gives none)."""
        return self._call("can_run", model=model, caps=caps, request=request)

    def generate(self, handle: Any, messages: list[Message], options: GenerateOptions) -> Any:
        """The handle's raw ``generate`` answer: the iterator it returned, or None."""
        return handle.generate(messages, options)

    def store_list(self) -> list[Any]:
        """Everything the backend's ``store_list`` returned, as a list (empty when it has no such hook)."""
        result: Iterable[Any] | None = self._call("store_list")
        return list(result or ())


@dataclasses.dataclass
class BackendStream:
    """What a handle's ``generate`` iterator yielded, read to its end or until a bound stopped the reading."""

    where: str
    max_new_tokens: int
    chunks: list[Any] = dataclasses.field(default_factory=list)
    #: The iterator ran out by itself.
    ended: bool = False
    #: The reading stopped at the chunk bound with the iterator still going.
    cut_off: bool = False
    #: No end within the time limit: the reading thread is still waiting on the backend.
    timed_out: bool = False
    #: What the iterator raised while being read.
    error: BaseException | None = None
    #: What ``close()`` raised after the reading stopped (a generator that swallows GeneratorExit).
    close_error: BaseException | None = None

    @property
    def text(self) -> str:
        """The deltas joined."""
        return "".join(c.delta for c in self.chunks if isinstance(getattr(c, "delta", None), str))

    @property
    def final_tokens(self) -> int:
        """The last chunk's token count (0 for an empty stream or a count that is not an int)."""
        tokens = getattr(self.chunks[-1], "tokens", 0) if self.chunks else 0
        return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0


def read_backend_stream(
    stream: Any, *, where: str, max_new_tokens: int, max_chunks: int, time_limit_s: float
) -> BackendStream:
    """Read ``stream`` (what a handle's ``generate`` returned) to its end, then close it.

    The reading happens on a daemon thread so a backend that hangs costs ``time_limit_s``, not the
    whole test run; it stops after ``max_chunks`` chunks so one that ignores ``max_new_tokens``
    cannot run for ever.
    """
    result = BackendStream(where=where, max_new_tokens=max_new_tokens)

    def read() -> None:
        try:
            for chunk in stream:
                result.chunks.append(chunk)
                if len(result.chunks) >= max_chunks:
                    result.cut_off = True
                    break
            else:
                result.ended = True
        except BaseException as exc:  # reported by the test that reads the result
            result.error = exc
        finally:
            close = getattr(stream, "close", None)
            if callable(close):
                try:
                    close()
                except BaseException as exc:
                    result.close_error = exc

    if stream is None:
        result.error = TypeError("the handle's generate returned None")
        return result
    reader = threading.Thread(target=read, name="conformance-backend-stream", daemon=True)
    reader.start()
    reader.join(time_limit_s)
    if reader.is_alive():
        result.timed_out = True
        result.chunks = list(result.chunks)
    return result
