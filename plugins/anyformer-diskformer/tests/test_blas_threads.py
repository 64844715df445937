"""BLAS is held to one thread during a CPU step and given back its thread count after."""

from __future__ import annotations

import threading

import numpy as np
from threadpoolctl import ThreadpoolController, threadpool_limits

from anyformer_diskformer.blas_threads import one_blas_thread


def _blas_threads() -> list[int]:
    return [lib.num_threads for lib in ThreadpoolController().select(user_api="blas").lib_controllers]


def test_one_thread_inside_and_the_count_put_back_after():
    np.ones((4, 4)) @ np.ones((4, 4))  # BLAS loaded
    with threadpool_limits(limits=2, user_api="blas"):
        assert _blas_threads() and set(_blas_threads()) == {2}
        with one_blas_thread():
            assert set(_blas_threads()) == {1}
            with one_blas_thread():  # nested: still one, and leaving it keeps the outer limit
                pass
            assert set(_blas_threads()) == {1}
        assert set(_blas_threads()) == {2}


def test_a_second_holder_leaving_keeps_the_first_ones_limit():
    # (Thread counts are read and set from this thread: OpenBLAS 0.3.31 reports a count set from another thread
    # as unchanged there.)
    np.ones((4, 4)) @ np.ones((4, 4))
    with threadpool_limits(limits=2, user_api="blas"):
        with one_blas_thread():
            done = threading.Event()

            def enter_and_leave() -> None:
                with one_blas_thread():
                    pass
                done.set()

            other = threading.Thread(target=enter_and_leave)
            other.start()
            other.join()
            assert done.is_set()
            assert set(_blas_threads()) == {1}
        assert set(_blas_threads()) == {2}
