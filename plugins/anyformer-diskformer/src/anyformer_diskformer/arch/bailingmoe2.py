"""bailingmoe2 (Ling 2.0): as bailingmoe, with its gating function, expert groups and selection bias from the
header, one fused q/k/v matrix and leading dense layers. The common config reader and the MoE engines run it."""

from __future__ import annotations

from anyformer_diskformer.arch.moe_config import HeaderReading
from anyformer_diskformer.arch.spec import ArchSpec, RoughShape

#: Rough shape: Ling 2.0/3.0 flash's (dense share from its total and active parameter counts).
SPEC = ArchSpec(
    name="bailingmoe2",
    reading=HeaderReading(
        norm_topk=None, leading_dense=True, header_gating=True, shared_width="count_shared", fused_qkv=True
    ),
    rough_shape=RoughShape(layers=32, experts=256, used=8, dense_share=0.05, kv_width=512, kv_share=1.0),
)
