"""gemma4 (Gemma 4's MoE): sliding-window and full-attention layers of their own widths, a dense MLP beside the
routed GELU experts.

Its config has its own reader (:mod:`~anyformer_diskformer.arch.gemma4_config`); its KV is sized per
layer (a sliding layer's ring); its engines are :mod:`~anyformer_diskformer.engines.cpu.gemma4` and
:mod:`~anyformer_diskformer.engines.gpu.gemma4`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from anyformer_diskformer.arch.gemma4_config import Gemma4Config, read_gemma4_config
from anyformer_diskformer.arch.moe_config import HeaderReading, MoEConfig
from anyformer_diskformer.arch.spec import ArchSpec, RoughShape
from anyformer_diskformer.arch.summary_facts import widest

if TYPE_CHECKING:
    from anyformer_diskformer.engines.cpu.moe import CpuMoEEngine
    from anyformer_diskformer.engines.gpu.moe import GpuMoEEngine


def gemma4_state_bytes(c: MoEConfig, context: int, step: int) -> int:
    """Gemma 4's K and V per layer in that layer's widths: ``context`` rows for a full layer, a sliding layer's ring
    for steps of up to ``step`` tokens (:meth:`Gemma4Config.kv_rows`)."""
    assert isinstance(c, Gemma4Config)  # the spec's reader made it
    return c.kv_bytes(context, step)


def gemma4_prompt_bytes(c: MoEConfig, context: int, tokens: int) -> int:
    """What Gemma 4's prompt steps of ``tokens`` tokens add to one token's GPU buffers, from its per-layer widths:
    the residual, attention output, MLP, experts', FFN sum and zero rows, the widest layer's q/k/v and attention
    rows and scores, and the step's router rows, experts' inputs and outputs, [gate | up] rows (the experts' or the
    widest MLP's) and combine table."""
    assert isinstance(c, Gemma4Config)  # the spec's reader made it
    tokens = min(tokens, context)
    if tokens <= 1:
        return 0
    layers = range(c.n_layer)
    qkv = max(c.heads[i] * c.head_dims[i] + 2 * c.kv_heads[i] * c.head_dims[i] for i in layers)
    attn = max(c.heads[i] * c.head_dims[i] for i in layers)
    rows = 6 * c.n_embd + qkv + attn + max(c.heads) * context
    k = c.n_expert_used
    step = c.n_expert + 2 * k * c.n_embd + max(2 * k * c.n_ff_exp, 2 * max(c.ffs)) + 2 * k
    # Each of the step's five buffers takes up to 20 bytes more (GPU.buffer's margin, rounded to 16).
    return 4 * ((tokens - 1) * rows + tokens * step) + 5 * 20


def gemma4_row_floats(summary: dict[str, Any], embd: int, q_dim: int) -> int:
    """Its MLP's [gate | up] rows, and the attention output, MLP, experts' and FFN sum rows and their zeros."""
    return 2 * widest(summary, "feed_forward_length") + 5 * embd


def _cpu_engine() -> type[CpuMoEEngine]:
    from anyformer_diskformer.engines.cpu.gemma4 import Gemma4CpuEngine

    return Gemma4CpuEngine


def _gpu_engine() -> type[GpuMoEEngine]:
    from anyformer_diskformer.engines.gpu.gemma4 import Gemma4GpuEngine

    return Gemma4GpuEngine


#: Rough shape: Gemma 4 26B-A4B's (its sliding layers hold less context).
SPEC = ArchSpec(
    name="gemma4",
    reading=HeaderReading(norm_topk=True),
    rough_shape=RoughShape(layers=30, experts=128, used=8, dense_share=0.12, kv_width=1024, kv_share=0.4),
    cpu_engine=_cpu_engine,
    gpu_engine=_gpu_engine,
    read_config=read_gemma4_config,
    state_bytes=gemma4_state_bytes,
    prompt_bytes=gemma4_prompt_bytes,
    prompt_row_floats=gemma4_row_floats,
)
