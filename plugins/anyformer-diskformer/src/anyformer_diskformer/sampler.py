"""The sampler of diskformer's replies: llama.cpp's defaults, top-k then top-p over the logits at a temperature."""

from __future__ import annotations

import numpy as np

#: Sampling defaults at a temperature above 0 (llama.cpp's own), overridable through ``extra``.
TOP_K = 40
TOP_P = 0.95


def sample(logits: np.ndarray, temperature: float, top_k: int, top_p: float, rng: np.random.Generator) -> int:
    """One id drawn at ``temperature`` among the ``top_k`` most likely (0: all) within mass ``top_p``."""
    order = np.argsort(-logits, kind="stable")
    if top_k > 0:  # 0 is no top-k, as llama.cpp reads it, never greedy
        order = order[:top_k]
    z = logits[order].astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    # The fewest ids whose mass reaches top_p (all of them when rounding leaves the sum just below 1).
    keep = min(len(p), int(np.searchsorted(np.cumsum(p), top_p) + 1))
    p = p[:keep] / p[:keep].sum()
    return int(order[rng.choice(keep, p=p)])
