"""Which onnxruntime is installed and which execution provider it will use, found without importing it.

``can_run`` runs on every ``anyformer check``, so it must not pay for importing onnxruntime: the
provider it reports comes from the installed distribution's name (``onnxruntime-gpu`` ships the
CUDA provider). ``load`` asks onnxruntime itself (:func:`available_providers`).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence

INSTALL_HINT = "pip install onnxruntime (or onnxruntime-gpu for CUDA)"

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
#: The providers this backend drives, best first; any other onnxruntime offers is left alone.
PREFERRED_PROVIDERS = (CUDA, CPU)


@functools.lru_cache(maxsize=1)
def onnxruntime_installed() -> bool:
    """True when ``import onnxruntime`` would find a package."""
    return importlib.util.find_spec("onnxruntime") is not None


@functools.lru_cache(maxsize=1)
def expected_provider(gpu: bool) -> str:
    """The provider a load will pick on a machine with (``gpu``) or without a GPU, from the distribution name."""
    if not gpu:
        return CPU
    # Imported here, only on a machine with a GPU: importlib.metadata costs every command ~13 ms at plugin import.
    import importlib.metadata

    for name in ("onnxruntime-gpu", "onnxruntime-gpu-cuda12", "onnxruntime-gpu-cuda13"):
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return CUDA
    return CPU


def choose_provider(available: Sequence[str], wanted: str | None = None) -> str:
    """The provider to run on: ``wanted`` when onnxruntime offers it, else CUDA, then the CPU."""
    if wanted:
        return wanted if wanted in available else CPU
    return next((p for p in PREFERRED_PROVIDERS if p in available), CPU)


def available_providers() -> list[str]:
    """The providers the installed onnxruntime offers (imports onnxruntime)."""
    import onnxruntime

    return list(onnxruntime.get_available_providers())
