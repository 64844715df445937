"""LFM2's gated short-convolution kernel against numpy, on odd shapes, across steps (its state stays on the GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy_reference_lfm2 import conv_reference

from anyformer_gguf_gpu.lfm2_config import MAX_CONV_TAPS
from anyformer_gguf_gpu.shortconv import ShortConvKernel


@pytest.fixture(scope="module")
def conv(gpu) -> ShortConvKernel:
    from anyformer_gguf_gpu.kernels import Kernels

    return ShortConvKernel(Kernels(gpu))


def _run(gpu, conv, bcx: np.ndarray, taps: np.ndarray, state, pos: int) -> np.ndarray:
    """One step over bcx's rows at ``pos``; returns y (the state buffer is updated in place)."""
    tokens, n = bcx.shape[0], bcx.shape[1] // 3
    bcx_buf = gpu.upload(bcx.astype(np.float32))
    taps_buf = gpu.upload(taps.astype(np.float32))
    y = gpu.buffer(tokens * n * 4)
    pos_state = gpu.upload(np.array([pos, tokens, 0, 0], dtype=np.uint32))
    d = conv.dispatch(bcx_buf, taps_buf, state, y, pos_state, n=n, n_taps=taps.shape[1], tokens=tokens)
    conv.kernels.run([d])
    return gpu.read(y, np.float32, tokens * n).reshape(tokens, n)


def _gated(bcx: np.ndarray, taps: np.ndarray, before: np.ndarray | None) -> np.ndarray:
    b, c, x = np.split(bcx.astype(np.float64), 3, axis=1)
    return c * conv_reference(b * x, taps.astype(np.float64), before)


@pytest.mark.parametrize(
    ("n", "n_taps", "steps"),
    [(1, 2, (1, 1, 1)), (37, 3, (5, 1, 1, 2)), (100, 5, (1, 3)), (4100, MAX_CONV_TAPS, (7, 1)), (63, 3, (9,))],
)
def test_steps_match_numpy_over_the_whole_sequence(gpu, conv, rng, n, n_taps, steps):
    """Steps of several sizes in a row equal one convolution over the whole sequence (the state carries)."""
    total = sum(steps)
    bcx = rng.standard_normal((total, 3 * n)).astype(np.float32)
    taps = rng.standard_normal((n, n_taps)).astype(np.float32)
    state = gpu.buffer((MAX_CONV_TAPS - 1) * n * 4)
    # Stale state from an earlier sequence: a step at position 0 must ignore it.
    gpu.write(state, rng.standard_normal((MAX_CONV_TAPS - 1) * n).astype(np.float32))
    ours, pos = [], 0
    for size in steps:
        ours.append(_run(gpu, conv, bcx[pos : pos + size], taps, state, pos))
        pos += size
    exact = _gated(bcx, taps, None)
    np.testing.assert_allclose(np.concatenate(ours), exact, rtol=1e-5, atol=1e-5)
    # The state holds the last n_taps - 1 inputs B * x, oldest first.
    kept = gpu.read(state, np.float32, (n_taps - 1) * n).reshape(n_taps - 1, n)
    assert total >= n_taps - 1
    b, _, x = np.split(bcx[-(n_taps - 1) :].astype(np.float64), 3, axis=1)
    np.testing.assert_allclose(kept, b * x, rtol=1e-6, atol=1e-6)


def test_a_step_past_position_zero_reads_the_state(gpu, conv, rng):
    """The inputs before the step come from the state, not zeros: a wrong tap order or a lost state shows."""
    n, n_taps = 19, 4
    before = rng.standard_normal((n_taps - 1, n)).astype(np.float32)
    state = gpu.upload(np.concatenate([before, np.zeros((MAX_CONV_TAPS - n_taps, n), np.float32)]))
    bcx = rng.standard_normal((2, 3 * n)).astype(np.float32)
    taps = rng.standard_normal((n, n_taps)).astype(np.float32)
    ours = _run(gpu, conv, bcx, taps, state, pos=5)
    np.testing.assert_allclose(ours, _gated(bcx, taps, before.astype(np.float64)), rtol=1e-5, atol=1e-5)
    assert np.abs(ours - _gated(bcx, taps, None)).max() > 1e-2


@pytest.mark.parametrize("n_taps", [1, MAX_CONV_TAPS + 1])
def test_tap_counts_the_window_does_not_hold_are_refused(gpu, conv, n_taps):
    buf = gpu.buffer(64)
    with pytest.raises(ValueError, match="taps"):
        conv.dispatch(buf, buf, buf, buf, buf, n=4, n_taps=n_taps, tokens=1)
