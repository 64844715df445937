"""Facts of the wgpu engines' buffers that the plan sizes without importing wgpu or the engines."""

from __future__ import annotations

#: Most tokens one GPU prompt step covers (:mod:`~anyformer_diskformer.engines.gpu.prompt` says why 32).
PROMPT_STEP = 32
#: Floats between two tokens' rows of qwen35moe's delta-net step buffers are a multiple of this
#: (:mod:`~anyformer_diskformer.engines.gpu.qwen35moe`): a per-token delta-rule dispatch binds its token's rows at an
#: offset, which must be a multiple of the device's storage-offset alignment (256 bytes at most in WebGPU).
ROW_ALIGN = 64


def aligned_row(floats: int) -> int:
    """``floats`` rounded up to a whole number of :data:`ROW_ALIGN` (a delta-net step buffer's row stride)."""
    return -(-floats // ROW_ALIGN) * ROW_ALIGN
