"""Shared fixtures: one wgpu device (lavapipe in CI) and its compiled kernels for the whole session."""

from __future__ import annotations

import numpy as np
import pytest

from anyformer_gguf_gpu.gpu import GPU
from anyformer_gguf_gpu.kernels import Kernels


@pytest.fixture(scope="session")
def gpu() -> GPU:
    """The adapter wgpu picks; a software one (lavapipe) is allowed here."""
    return GPU(allow_software=True)


@pytest.fixture(scope="session")
def kernels(gpu: GPU) -> Kernels:
    """Kernels compiled on ``gpu`` once for every test."""
    return Kernels(gpu)


@pytest.fixture(scope="session", params=[1, 32], ids=["1-thread-rows", "32-thread-rows"])
def matrix_kernels(gpu: GPU, request: pytest.FixtureRequest) -> Kernels:
    """Kernels with each matrix-kernel shape: one thread per row (CPU adapters) and 32 (GPUs)."""
    return Kernels(gpu, threads_per_row=request.param)


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded generator, so a failure reproduces."""
    return np.random.default_rng(1234)
