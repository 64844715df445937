"""Progress events for long work (downloads, loading), and the callback type that receives them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class ProgressEvent:
    """One step of long work: ``stage`` (``download``, ``verify``, ``load``…), the file, bytes done of total."""

    stage: str
    backend: str | None = None
    file: str | None = None
    done: int = 0
    total: int | None = None
    message: str = ""


#: Receives progress events; it must be quick and must not raise.
ProgressCallback = Callable[[ProgressEvent], None]


def no_progress(event: ProgressEvent) -> None:
    """A progress callback that ignores every event."""
