"""qwen35moe (Qwen3.5/3.6 MoE): gated delta-net layers between full-attention ones, each with routed experts.

Its config is the common one plus the delta nets' sizes, which layers are delta nets and the rotary
sections (:func:`qwen35moe_fields`); its state is sized per layer (attention KV, delta-net convolution
inputs and state matrices); its engines are :mod:`~anyformer_diskformer.engines.cpu.qwen35moe` and
:mod:`~anyformer_diskformer.engines.gpu.qwen35moe`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_diskformer.arch.moe_config import UNREAD, HeaderReading, MoEConfig, config_int
from anyformer_diskformer.arch.spec import ArchSpec, RoughShape
from anyformer_diskformer.engines.gpu.layout import aligned_row

if TYPE_CHECKING:
    from anyformer_diskformer.engines.cpu.moe import CpuMoEEngine
    from anyformer_diskformer.engines.gpu.moe import GpuMoEEngine


def qwen35moe_fields(kv: dict[str, Any], arch: str, n_layer: int) -> dict[str, Any]:
    """qwen35moe's delta-net sizes, layer kinds and rotary sections, as llama.cpp reads them."""
    layers = kv.get(f"{arch}.attention.recurrent_layers")
    if layers is None:
        # No list: every ``full_attention_interval``-th layer is attention, the others delta nets.
        interval = config_int(kv, f"{arch}.full_attention_interval", 4)
        recurrent = tuple((i + 1) % interval != 0 for i in range(n_layer))
    elif isinstance(layers, Sequence) and not isinstance(layers, str) and len(layers) >= n_layer:
        recurrent = tuple(bool(v) for v in layers[:n_layer])
    else:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{arch}.attention.recurrent_layers does not list every layer")
    k_heads, v_heads = config_int(kv, f"{arch}.ssm.group_count"), config_int(kv, f"{arch}.ssm.time_step_rank")
    head, inner = config_int(kv, f"{arch}.ssm.state_size"), config_int(kv, f"{arch}.ssm.inner_size")
    if v_heads % k_heads or inner != v_heads * head:
        # llama.cpp's delta net needs value heads as wide as key heads, tiled over them.
        raise AnyformerError(
            ErrorCode.BAD_MODEL,
            f"{v_heads} delta-net value heads of {inner / v_heads:g} over {k_heads} key heads of {head}, {UNREAD}",
        )
    sections = kv.get(f"{arch}.rope.dimension_sections", [])
    if not isinstance(sections, Sequence) or not all(isinstance(v, int) and v >= 0 for v in sections):
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{arch}.rope.dimension_sections is not a list of counts")
    sections = [*sections, 0, 0, 0, 0][:4]
    return {
        "qk_norm": True,
        "recurrent": recurrent,
        "ssm_conv": config_int(kv, f"{arch}.ssm.conv_kernel"),
        "ssm_k_heads": k_heads,
        "ssm_v_heads": v_heads,
        "ssm_head": head,
        "attn_gated": True,
        "ffn_norm": "post_attention_norm",
        "rope_sections": tuple(sections) if sum(sections) else (),
    }


def qwen35moe_state_bytes(c: MoEConfig, context: int, step: int) -> int:
    """The f32 K and V rows of its attention layers and each delta-net layer's convolution inputs and state
    matrices (no rings: ``step`` changes nothing)."""
    kv = 2 * (c.n_layer - sum(c.recurrent)) * context * c.kv_dim * 4
    delta = sum(c.recurrent) * (
        (c.ssm_conv - 1) * (2 * c.ssm_k_heads + c.ssm_v_heads) * c.ssm_head + c.ssm_v_heads * c.ssm_head**2
    )
    return kv + 4 * delta


def qwen35moe_prompt_bytes(c: MoEConfig, context: int, tokens: int) -> int:
    """What qwen35moe's prompt steps of ``tokens`` tokens add to one token's GPU buffers: the residual, q/k/v (each
    query followed by its gate), attention and score rows, the delta nets' projection, convolution and output rows
    (:func:`aligned_row` apart) and the position block of a step's later tokens, and the step's router rows, experts'
    inputs, [gate | up] rows (the routed and shared experts') and outputs and combine table."""
    tokens = min(tokens, context)
    if tokens <= 1:
        return 0
    keys, values = c.ssm_k_heads * c.ssm_head, c.ssm_v_heads * c.ssm_head
    channels = 2 * keys + values
    delta = aligned_row(channels + values + 2 * c.ssm_v_heads) + aligned_row(channels) + aligned_row(values)
    rows = c.n_embd + 3 * c.q_dim + 2 * c.kv_dim + c.n_head * context + delta
    k = c.n_expert_used
    m = k + (1 if c.n_ff_shexp else 0)
    step = c.n_expert + 1 + (k + m) * c.n_embd + max(2 * k * c.n_ff_exp + 2 * c.n_ff_shexp, 2 * c.n_ff) + 2 * m
    # Each of the twelve buffers takes up to 20 bytes more (GPU.buffer's margin, rounded to 16); the block is 16.
    return 4 * ((tokens - 1) * rows + tokens * step) + 12 * 20 + 32


def qwen35moe_row_floats(summary: dict[str, Any], embd: int, q_dim: int) -> int:
    """Each query's output gate beside it, and the delta nets' projection, convolution and output rows, which the
    summary does not size (Qwen3.5's are about 12 n_embd, the fixtures' 7 and 9): 16 n_embd."""
    return q_dim + 16 * embd


def _cpu_engine() -> type[CpuMoEEngine]:
    from anyformer_diskformer.engines.cpu.qwen35moe import HybridCpuEngine

    return HybridCpuEngine


def _gpu_engine() -> type[GpuMoEEngine]:
    from anyformer_diskformer.engines.gpu.qwen35moe import HybridGpuEngine

    return HybridGpuEngine


#: Rough shape: Qwen3.5/3.6-35B-A3B's (its delta-net layers hold no KV: a quarter of the layers' context).
SPEC = ArchSpec(
    name="qwen35moe",
    reading=HeaderReading(norm_topk=True, extra=qwen35moe_fields),
    rough_shape=RoughShape(layers=40, experts=256, used=8, dense_share=0.08, kv_width=512, kv_share=0.25),
    cpu_engine=_cpu_engine,
    gpu_engine=_gpu_engine,
    state_bytes=qwen35moe_state_bytes,
    prompt_bytes=qwen35moe_prompt_bytes,
    prompt_row_floats=qwen35moe_row_floats,
)
