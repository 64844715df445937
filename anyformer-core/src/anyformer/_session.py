"""Where a loaded model runs: in this process, or in an isolated worker (``anyformer.isolation._worker_session``).

``Loaded`` holds one session and keeps the contract itself (validation, the limit of open streams
and BUSY, CoreStream), so both kinds of session only start work, run it and free it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, Protocol

from anyformer._backend import BackendModel, features_of
from anyformer._run_progress import run_reporter
from anyformer.contract._chunk import Chunk, GenerateOptions
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._features import Features
from anyformer.contract._messages import Message
from anyformer.contract._progress import ProgressCallback


class Session(Protocol):
    """A loaded model as ``Loaded`` drives it: at most ``parallel`` calls and streams at once (``Loaded`` counts)."""

    @property
    def backend(self) -> str:
        """The id of the backend running the model."""

    @property
    def task(self) -> str:
        """The task the model was loaded for."""

    @property
    def pid(self) -> int | None:
        """The worker's process id, or None when the model runs in this process."""

    @property
    def handle(self) -> BackendModel:
        """The backend's own handle; only an in-process session has one."""

    @property
    def features(self) -> Features:
        """What the backend's handle declared it can do (checked, with ``run`` filled in)."""

    def start(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """Begin a generation; errors the backend finds before streaming are raised here."""

    def run(
        self,
        input: Any,
        options: dict[str, Any],
        progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> Any:
        """Run a non-generation task on ``input``; a ``run_progress`` backend reports to ``progress`` and
        raises ``CANCELLED`` between units once ``cancel`` is set."""

    def dispose(self) -> None:
        """Free the model; a second call does nothing."""


class InProcessSession:
    """The backend's handle in this process, its methods called directly."""

    pid = None

    def __init__(self, handle: BackendModel) -> None:
        self._handle = handle
        self.backend = handle.backend
        self.task = handle.task
        self.features = features_of(handle)

    @property
    def handle(self) -> BackendModel:
        """The backend's own handle."""
        return self._handle

    def start(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """Call the handle's ``generate``."""
        return start_generation(self._handle, messages, options)

    def run(
        self,
        input: Any,
        options: dict[str, Any],
        progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> Any:
        """Call the handle's ``run``, with the core's ``progress`` callable when it declares ``run_progress``."""
        if self.features.run_progress:
            return self._handle.run(input, progress=run_reporter(self.backend, progress, cancel), **options)
        return self._handle.run(input, **options)

    def dispose(self) -> None:
        """Call the handle's ``dispose`` (``Loaded`` calls this once)."""
        self._handle.dispose()


def start_generation(handle: BackendModel, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
    """The iterator of the handle's ``generate``; what else it raises or returns is a ``PLUGIN_ERROR`` naming it."""
    from anyformer._plugins import describe_exception

    try:
        stream = handle.generate(messages, options)
    except AnyformerError:
        raise
    except Exception as exc:
        raise AnyformerError(
            ErrorCode.PLUGIN_ERROR, f"{handle.backend}: generate raised {describe_exception(exc)}", cause=exc
        ) from exc
    if stream is None:
        raise AnyformerError(ErrorCode.PLUGIN_ERROR, f"{handle.backend}: generate returned None")
    return iter(stream)
