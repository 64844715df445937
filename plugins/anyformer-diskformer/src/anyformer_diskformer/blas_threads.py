"""BLAS kept to one thread while the CPU engine computes a step.

The engine's products are many small BLAS calls (a band's rows times one group of 32 codes, a
few hundred thousand multiply-adds each) made from the engine's own worker threads. OpenBLAS,
left at its default, hands each call big enough to its own pool of one thread a core: it wakes
those threads for a call that takes microseconds and serialises callers from different threads on
its pool, so the engine's threads wait on each other instead of computing side by side. Measured on
2 cores (bench/results/cpu-2026-12-01.md): one such call takes as long with 2 BLAS threads as with 1
while burning 1.76 cores instead of 1; decode speed with and without the limit was within the noise
there; with 16 engine threads on 16 cores each BLAS call would wake 16 more. The limit is
process-wide while it is held (threadpoolctl sets the library's thread count), so it is held for
one step and put back after.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from threadpoolctl import ThreadpoolController

_lock = threading.Lock()
_controller: ThreadpoolController | None = None
_held = 0
_saved: list[int] = []


def _blas() -> ThreadpoolController:
    """The BLAS libraries loaded in this process (looked up once: it walks the loaded libraries)."""
    global _controller
    if _controller is None:
        _controller = ThreadpoolController().select(user_api="blas")
    return _controller


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Hold BLAS to one thread for the ``with`` block; nested or concurrent holders share one limit, and the
    thread counts found by the first are put back when the last leaves."""
    global _held, _saved
    with _lock:
        if _held == 0:
            libraries = _blas().lib_controllers
            _saved = [lib.num_threads for lib in libraries]
            for lib in libraries:
                lib.set_num_threads(1)
        _held += 1
    try:
        yield
    finally:
        with _lock:
            _held -= 1
            if _held == 0:
                for lib, threads in zip(_blas().lib_controllers, _saved, strict=True):
                    lib.set_num_threads(threads)
