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


_MATRIX_SHAPES = {
    "1-thread-rows": (1, False),
    "32-thread-rows": (32, False),
    "32-thread-subgroups": (32, True),
    "4-thread-subgroups": (4, True),
}


@pytest.fixture(scope="session", params=list(_MATRIX_SHAPES))
def matrix_kernels(gpu: GPU, request: pytest.FixtureRequest) -> Kernels:
    """Kernels with each matrix-kernel shape: one thread per row (CPU adapters), 32 summed in workgroup memory
    (GPUs without subgroups), and rows summed by subgroup shuffles: 32 threads a row spanning several of
    lavapipe's 8-wide subgroups, 4 threads a row inside one."""
    tpr, subgroups = _MATRIX_SHAPES[request.param]
    if subgroups and not gpu.has_subgroups:
        pytest.skip("the adapter has no subgroups")
    return Kernels(gpu, threads_per_row=tpr, subgroups=subgroups)


@pytest.fixture(scope="session", params=[False, True], ids=["f32-cache", "f16-cache"])
def kv_kernels(gpu: GPU, request: pytest.FixtureRequest) -> Kernels:
    """Kernels with an f32 and (where the adapter has shader-f16) an f16 KV cache."""
    if request.param and not gpu.has_f16:
        pytest.skip("the adapter has no shader-f16")
    return Kernels(gpu, kv_f16=request.param)


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded generator, so a failure reproduces."""
    return np.random.default_rng(1234)
