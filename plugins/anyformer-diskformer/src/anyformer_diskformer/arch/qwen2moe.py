"""qwen2moe (Qwen1.5/Qwen2 MoE): q/k/v biases, routed experts whose softmax weights are kept as they are, and a
shared expert behind a sigmoid gate. The common config reader and the MoE engines run it."""

from __future__ import annotations

from anyformer_diskformer.arch.moe_config import HeaderReading
from anyformer_diskformer.arch.spec import ArchSpec, RoughShape

#: Rough shape: Qwen1.5-MoE-A2.7B's.
SPEC = ArchSpec(
    name="qwen2moe",
    reading=HeaderReading(norm_topk=False),
    rough_shape=RoughShape(layers=24, experts=60, used=4, dense_share=0.15, kv_width=2048, kv_share=1.0),
)
