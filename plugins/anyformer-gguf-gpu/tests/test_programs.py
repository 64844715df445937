"""A program bound once runs in other shapes by a uniform write alone, against numpy; a different step is refused."""

from __future__ import annotations

import numpy as np
import pytest

from anyformer_gguf_gpu.kernels import Kernels
from anyformer_gguf_gpu.programs import BoundProgram
from anyformer_gguf_gpu.testing import BINDERS, COMPILERS, compiles_counted

N, ROWS, EPS = 40, 6, 1e-5


def _rmsnorm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64**2).mean(axis=-1, keepdims=True) + EPS) * w


def test_other_shapes_reuse_the_bound_dispatches_and_give_numpys_values(gpu, rng):
    kernels = Kernels(gpu)
    x = rng.standard_normal((ROWS, N)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(N)).astype(np.float32)
    xb, wb, yb = gpu.upload(x), gpu.upload(w), gpu.buffer(ROWS * N * 4)

    def step(tokens: int, first: int) -> list:
        # Two dispatches, so the second's uniform block sits one stride into the buffer.
        with kernels.unbound():
            return [
                kernels.rmsnorm(xb, wb, yb, N, EPS, tokens=tokens, x_off=first * N),
                kernels.rmsnorm(xb, wb, yb, N, EPS, tokens=tokens, x_off=first * N),
            ]

    program = BoundProgram(kernels, step(ROWS, 0))
    kernels.run(program.dispatches)
    np.testing.assert_allclose(gpu.read(yb, np.float32, ROWS * N).reshape(ROWS, N), _rmsnorm(x, w), rtol=1e-5)
    with compiles_counted(gpu.device, (*COMPILERS, *BINDERS)) as made:
        for tokens, first in ((2, 3), (1, 5), (4, 1)):
            gpu.write(yb, np.zeros(ROWS * N, np.float32))
            shaped = program.shaped((tokens, first), lambda t=tokens, f=first: ([0, 1], step(t, f)))
            assert [d.groups for d in shaped] == [(tokens, 1, 1)] * 2
            kernels.run(shaped)
            got = gpu.read(yb, np.float32, ROWS * N).reshape(ROWS, N)
            np.testing.assert_allclose(got[:tokens], _rmsnorm(x[first : first + tokens], w), rtol=1e-5)
            assert not got[tokens:].any(), "rows past the step's tokens are left alone"
    assert made == [], f"made while reshaping: {made}"
    program.release()


def test_a_step_that_differs_from_the_bound_one_is_refused(gpu, rng):
    kernels = Kernels(gpu)
    xb, wb, yb, other = gpu.buffer(ROWS * N * 4), gpu.buffer(N * 4), gpu.buffer(ROWS * N * 4), gpu.buffer(N * 4)
    with kernels.unbound():
        program = BoundProgram(kernels, [kernels.rmsnorm(xb, wb, yb, N, EPS, tokens=ROWS)])
        elsewhere = [kernels.rmsnorm(xb, other, yb, N, EPS, tokens=2)]
    with pytest.raises(RuntimeError, match="differs from the one bound"):
        program.shaped("other buffer", lambda: ([0], elsewhere))
    with pytest.raises(ValueError, match="unbound"):
        BoundProgram(kernels, [kernels.rmsnorm(xb, wb, yb, N, EPS)])
    program.release()
