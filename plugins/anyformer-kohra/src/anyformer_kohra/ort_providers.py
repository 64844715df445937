"""Which onnxruntime execution provider kohra runs on, decided without importing onnxruntime where possible.

``can_run`` runs on every ``anyformer check`` and must stay light, so it guesses the provider from
the installed distribution (``onnxruntime-gpu`` ships CUDA) and the machine's capabilities; ``load``
asks onnxruntime itself. This module holds no kohra specifics: it is the part another ONNX backend
would share.
"""

from __future__ import annotations

import importlib.util

from anyformer.plugin import Caps

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
#: Providers tried in this order when onnxruntime offers them; the CPU is always last.
PREFERRED = (CUDA, CPU)
#: Providers that compute fp16 graphs natively (the CPU provider falls back or lacks kernels).
FP16_PROVIDERS = frozenset({CUDA, "TensorrtExecutionProvider", "DmlExecutionProvider", "CoreMLExecutionProvider"})


def onnxruntime_installed() -> bool:
    """True when the onnxruntime module can be imported (checked without importing it)."""
    return importlib.util.find_spec("onnxruntime") is not None


def _has_distribution(name: str) -> bool:
    # Imported here, only on a machine with a GPU: importlib.metadata costs every command ~13 ms at plugin import.
    import importlib.metadata

    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def planned_provider(caps: Caps) -> str:
    """The provider ``load`` will most likely pick on this machine, guessed without importing onnxruntime."""
    if caps.gpu and _has_distribution("onnxruntime-gpu"):
        return CUDA
    return CPU


def session_providers(available: list[str]) -> list[str]:
    """The providers to open a session with, from those onnxruntime reports, best first."""
    chosen = [p for p in PREFERRED if p in available]
    return chosen or [CPU]


def handles_fp16(provider: str) -> bool:
    """True when ``provider`` computes fp16 graphs natively."""
    return provider in FP16_PROVIDERS
