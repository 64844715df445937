"""Which language-model GGUF of a repo llama.cpp loads: the core's candidates in the original wllama order.

The names, quants and split sets are the core's (:func:`anyformer.plugin.gguf_candidates`); what is
llama.cpp's own is the order it tries them in and which quants it reads. ``can_run`` judges them
in that order (:func:`anyformer.plugin.choose_gguf_candidate`), the next smaller one when one does
not fit host memory.
"""

from __future__ import annotations

from anyformer.plugin import (
    KNOWN_GGUF_QUANTS,
    GGUFCandidate,
    Model,
    ModelFile,
    gguf_candidates,
    gguf_quant,
    is_gguf_projector,
    order_gguf_candidates,
)

#: Quant preference: the best size/quality trade-offs first (as the original's wllama back end).
PREFERRED_QUANTS = ("Q4_K_M", "Q4_0", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0")

#: What this module's callers knew as the quant of a name.
quant_of = gguf_quant
is_projector = is_gguf_projector


def readable_by_llamacpp(quant: str | None) -> bool:
    """True when llama.cpp reads this quant (or the name states none, and the header decides)."""
    return quant is None or quant in KNOWN_GGUF_QUANTS


def llamacpp_order(model: Model) -> list[GGUFCandidate]:
    """The complete candidates llama.cpp reads, in the order it tries them."""
    return order_gguf_candidates(gguf_candidates(model), PREFERRED_QUANTS, KNOWN_GGUF_QUANTS)


def choose_gguf(model: Model) -> GGUFCandidate | None:
    """The candidate llama.cpp prefers before any fits its memory; None when there is none it reads.

    Projector files are skipped, a complete split set counts as one model and an incomplete one as
    none, and a name stating a quant llama.cpp does not read is skipped.
    """
    order = llamacpp_order(model)
    return order[0] if order else None


def projector_for(model: Model) -> ModelFile | None:
    """The repo's multimodal projector (``mmproj``), preferring f16, or None."""
    projectors = [f for f in model.files if f.format == "gguf" and is_gguf_projector(f.name)]
    if not projectors:
        return None
    return min(projectors, key=lambda f: (0 if "f16" in f.name.lower() else 1, f.name))
