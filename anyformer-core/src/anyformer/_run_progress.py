"""Progress and cancel for ``Loaded.run``: what the core hands a handle that declares ``run_progress``.

A long ``run`` (an hour of audio, a big batch of texts) reports its units of work the way ``load``
does, with :class:`ProgressEvent` (``stage``, ``done`` of ``total``), and stops between two of them
when the caller sets ``cancel``. A backend does one thing for both: it calls the ``progress``
callable the core passes it once after each unit. The core's callable (:func:`run_reporter`)
hands the event to the caller and raises ``AnyformerError(CANCELLED)`` when ``cancel`` is set, so
the backend's call unwinds from that point (its ``finally`` blocks run) and no partial result is
ever returned. The same callable runs inside an isolated worker, where ``cancel`` is the event the
parent's ``cancel`` frame sets and the caller's callback is a frame sent back over the pipe.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._progress import ProgressCallback, ProgressEvent, no_progress


def check_run_controls(progress: Any, cancel: Any) -> None:
    """``BAD_REQUEST`` unless ``progress`` is None or callable and ``cancel`` None or an event."""
    if progress is not None and not callable(progress):
        raise AnyformerError(ErrorCode.BAD_REQUEST, "progress must be a callable taking a ProgressEvent")
    if cancel is not None and not (hasattr(cancel, "is_set") and hasattr(cancel, "set")):
        raise AnyformerError(ErrorCode.BAD_REQUEST, "cancel must be a threading.Event")


def cancelled(backend: str, what: str = "run") -> AnyformerError:
    """The error a cancelled ``run`` ends with."""
    return AnyformerError(ErrorCode.CANCELLED, f"{backend}: the {what} was cancelled; no result was produced")


def run_reporter(backend: str, progress: ProgressCallback | None, cancel: threading.Event | None) -> ProgressCallback:
    """The ``progress`` callable a handle's ``run`` gets: passes events on and raises ``CANCELLED`` on cancel.

    The event is delivered before the cancel is looked at again, so a caller that decides to stop on
    seeing an event (``done == 1``) stops the run right there. An event that is not a
    :class:`ProgressEvent` is the backend's bug: ``PLUGIN_ERROR``. An event without ``backend`` gets
    this backend's id.
    """
    deliver = progress or no_progress

    def report(event: ProgressEvent) -> None:
        if not isinstance(event, ProgressEvent):
            raise AnyformerError(
                ErrorCode.PLUGIN_ERROR, f"{backend}: run reported {type(event).__name__}, not a ProgressEvent"
            )
        if cancel is not None and cancel.is_set():
            raise cancelled(backend)
        if event.backend is None:
            event = dataclasses.replace(event, backend=backend)
        deliver(event)
        if cancel is not None and cancel.is_set():
            raise cancelled(backend)

    return report
