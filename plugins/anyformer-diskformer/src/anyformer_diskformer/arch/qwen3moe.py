"""qwen3moe (Qwen3 MoE): attention with per-head q/k norms and routed experts; llama.cpp renormalises the
selected softmax weights to sum to 1. The common config reader and the MoE engines run it."""

from __future__ import annotations

from anyformer_diskformer.arch.moe_config import HeaderReading
from anyformer_diskformer.arch.spec import ArchSpec, RoughShape

#: Rough shape: Qwen3-30B-A3B's (dense share from its total and active parameter counts).
SPEC = ArchSpec(
    name="qwen3moe",
    reading=HeaderReading(norm_topk=True),
    rough_shape=RoughShape(layers=48, experts=128, used=8, dense_share=0.06, kv_width=512, kv_share=1.0),
)
