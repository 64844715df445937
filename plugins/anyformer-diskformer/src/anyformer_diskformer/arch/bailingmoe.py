"""bailingmoe (Ling): the header says whether the top-k weights are renormalised (``expert_weights_norm``) and
scales them (``expert_weights_scale``); ungated shared experts; the original (adjacent-pair) rotary. The common
config reader and the MoE engines run it."""

from __future__ import annotations

from anyformer_diskformer.arch.moe_config import HeaderReading
from anyformer_diskformer.arch.spec import ArchSpec, RoughShape

#: Rough shape: Ling lite's.
SPEC = ArchSpec(
    name="bailingmoe",
    reading=HeaderReading(norm_topk=None, shared_width="count", rope_neox=False),
    rough_shape=RoughShape(layers=28, experts=64, used=6, dense_share=0.1, kv_width=2048, kv_share=1.0),
)
