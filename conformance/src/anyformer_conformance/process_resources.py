"""The threads and open file descriptors of the test process, to compare before a load and after its dispose.

A server loads and disposes models for weeks; a thread or a file each load leaves behind is a
leak that only shows there. The kit counts both around a load and dispose of the sample.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time

__all__ = ["ProcessResources", "left_behind"]

# Linux and most BSDs list a process's descriptors here; elsewhere the kit checks threads only.
_FD_FOLDER = "/proc/self/fd"


def _open_descriptors() -> dict[int, str] | None:
    """Each open descriptor and what it names (a path, ``socket:[…]``, ``pipe:[…]``); None where unknown."""
    if not os.path.isdir(_FD_FOLDER):
        return None
    found = {}
    for name in os.listdir(_FD_FOLDER):
        try:
            found[int(name)] = os.readlink(os.path.join(_FD_FOLDER, name))
        except OSError:
            continue  # the descriptor listdir itself used, closed again by now
    return found


@dataclasses.dataclass(frozen=True)
class ProcessResources:
    """The live threads (by identity) and the open descriptors of this process at one moment."""

    threads: dict[int, str]
    descriptors: dict[int, str] | None

    @classmethod
    def now(cls) -> ProcessResources:
        """What is live and open right now."""
        return cls({t.ident or 0: t.name for t in threading.enumerate()}, _open_descriptors())


def left_behind(before: ProcessResources, *, settle_s: float) -> tuple[list[str], list[str]]:
    """The threads and descriptors live now that were not in ``before``, after waiting up to ``settle_s``.

    A thread ending or a descriptor closing a moment after ``dispose`` returned is not a leak,
    so the comparison is retried until both match or the time is up.
    """
    deadline = time.monotonic() + settle_s
    while True:
        now = ProcessResources.now()
        threads = sorted(name for ident, name in now.threads.items() if ident not in before.threads)
        descriptors: list[str] = []
        if before.descriptors is not None and now.descriptors is not None:
            descriptors = sorted(
                f"{fd} -> {target}" for fd, target in now.descriptors.items() if before.descriptors.get(fd) != target
            )
        if (not threads and not descriptors) or time.monotonic() >= deadline:
            return threads, descriptors
        time.sleep(0.05)
