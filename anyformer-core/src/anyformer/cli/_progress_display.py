"""Progress on stderr for people: a bar per file while downloading or loading, and one for the total."""

from __future__ import annotations

import sys
from typing import Any

from anyformer.contract._progress import ProgressEvent


class ProgressPrinter:
    """A progress callback that draws rich progress bars on stderr when it is a terminal.

    Use it as a context manager so the bars are cleaned up; on a pipe it prints one line per stage.
    """

    def __init__(self) -> None:
        self._progress: Any = None
        self._tasks: dict[tuple[str, str | None], Any] = {}
        self._seen: set[tuple[str, str | None]] = set()

    def __enter__(self) -> ProgressPrinter:
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def __call__(self, event: ProgressEvent) -> None:
        key = (event.stage, event.file)
        if self._progress is None:
            if key not in self._seen:
                self._seen.add(key)
                what = f" {event.file}" if event.file else ""
                print(f"anyformer: {event.stage}{what} {event.message}".rstrip(), file=sys.stderr)
            return
        task = self._tasks.get(key)
        if task is None:
            # An event without a file is the stage as a whole (a download's ``total`` over every file).
            label = f"{event.stage} {event.file or event.message}".strip()
            task = self._tasks[key] = self._progress.add_task(label, total=event.total)
        self._progress.update(task, completed=event.done, total=event.total)
