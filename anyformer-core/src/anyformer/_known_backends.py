"""The backend packages anyformer knows of, and which model formats each reads.

When no installed backend reads a model's format, the error names the distributions that do
instead of only saying that none can. ``docs/backends/README.md`` holds the same table for
people; a test keeps the two equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class KnownBackend:
    """One backend distribution: its backend id, the formats it reads, and what it runs."""

    distribution: str
    backend: str
    formats: tuple[str, ...]
    runs: str


#: Every known backend package, general engines last within a format.
KNOWN_BACKENDS: tuple[KnownBackend, ...] = (
    KnownBackend("anyformer-llamacpp", "llamacpp", ("gguf",), "any GGUF llama.cpp reads, on the GPU or the CPU"),
    KnownBackend("anyformer-onnx", "onnx", ("onnx",), "ONNX exports of Hub models through onnxruntime"),
    KnownBackend(
        "anyformer-localmind", "localmind", ("gguf",), "hand-written GPU engines for chosen architectures (wgpu)"
    ),
    KnownBackend(
        "anyformer-diskformer", "diskformer", ("gguf",), "mixture-of-experts GGUFs larger than GPU memory or RAM"
    ),
    KnownBackend("anyformer-kohra", "kohra", ("onnx",), "text-diffusion language models (MDLM, BD3LM) as ONNX"),
    KnownBackend(
        "anyformer-transformers",
        "transformers",
        ("safetensors",),
        "safetensors checkpoints on torch and transformers (causal LMs; the fallback)",
    ),
)


def distributions_for(formats: Iterable[str], installed: Iterable[str] = ()) -> list[KnownBackend]:
    """The known backends that read one of ``formats``, leaving out the backend ids in ``installed``."""
    wanted = set(formats)
    have = set(installed)
    return [known for known in KNOWN_BACKENDS if wanted.intersection(known.formats) and known.backend not in have]


def install_hint(formats: Iterable[str], installed: Iterable[str] = ()) -> str:
    """One clause saying which distributions read ``formats``: ``gguf: pip install anyformer-llamacpp``.

    Empty when no known package reads any of them (the description's formats are all unknown).
    """
    formats = [f for f in dict.fromkeys(formats)]
    parts = []
    for fmt in formats:
        packages = [known.distribution for known in distributions_for([fmt], installed)]
        if packages:
            parts.append(f"{fmt}: pip install {' or '.join(packages)}")
    return "; ".join(parts)
