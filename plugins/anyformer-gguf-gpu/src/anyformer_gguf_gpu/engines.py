"""Which engine runs a GGUF's architecture, and what it will hold on the GPU: the one place a backend asks.

``llama`` and ``qwen3`` run on :class:`~anyformer_gguf_gpu.transformer.TransformerEngine`, ``lfm2``
on :class:`~anyformer_gguf_gpu.lfm2.Lfm2Engine` (the architectures listed in
``config.ENGINE_ARCHITECTURES``). Only light modules are imported here at first; the engines
(numpy, wgpu on first use) load when one is opened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from anyformer_gguf_gpu.config import Footprint, footprint
from anyformer_gguf_gpu.lfm2_config import lfm2_footprint

if TYPE_CHECKING:
    from anyformer_gguf_gpu.gguf_file import GGUFFile
    from anyformer_gguf_gpu.gpu import GPU
    from anyformer_gguf_gpu.transformer import LoadProgress, TransformerEngine


def open_engine(
    gpu: GPU,
    gguf: GGUFFile,
    *,
    ctx: int,
    max_batch: int,
    kv_f16: bool | None = None,
    progress: LoadProgress | None = None,
) -> TransformerEngine:
    """The engine of the GGUF's architecture, loaded on ``gpu`` (``BAD_MODEL`` where no engine reads it)."""
    if gguf.header.architecture == "lfm2":
        from anyformer_gguf_gpu.lfm2 import Lfm2Engine

        return Lfm2Engine(gpu, gguf, ctx=ctx, max_batch=max_batch, kv_f16=kv_f16, progress=progress)
    from anyformer_gguf_gpu.transformer import TransformerEngine

    return TransformerEngine(gpu, gguf, ctx=ctx, max_batch=max_batch, kv_f16=kv_f16, progress=progress)


def engine_footprint(summary: dict[str, Any], context: int, max_batch: int, *, kv_f16: bool = False) -> Footprint:
    """What the engine of the summary's architecture will hold on the GPU (the ``gpu_bytes`` it reports)."""
    if summary.get("architecture") == "lfm2":
        return lfm2_footprint(summary, context, max_batch, kv_f16=kv_f16)
    return footprint(summary, context, max_batch, kv_f16=kv_f16)
