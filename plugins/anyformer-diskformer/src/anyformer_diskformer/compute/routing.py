"""Which experts a token goes to, and with what weights: the router's logits through the architecture's gating.

As llama.cpp's MoE graph: the logits become probabilities (softmax over all experts, or a sigmoid
each); a selection bias (``exp_probs_b``) may be added to choose the experts but never to weight
them; with expert groups only the groups whose two best biased probabilities sum highest take part;
the top-k are chosen (ties to the lower index, as ggml's argsort), their unbiased probabilities
renormalised to sum to 1 where the architecture says so, then scaled.
"""

from __future__ import annotations

import numpy as np

from anyformer_diskformer.arch.moe_config import MoEConfig

#: llama.cpp clamps the sum of the top-k weights below by the smallest normal f16 before dividing by it.
_MIN_SUM = np.float32(6.103515625e-5)


def _probabilities(logits: np.ndarray, gating: str) -> np.ndarray:
    if gating == "sigmoid":
        return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    z = logits - logits.max(axis=-1, keepdims=True)
    p = np.exp(z)
    return (p / p.sum(axis=-1, keepdims=True)).astype(np.float32)


def _group_mask(selection: np.ndarray, n_group: int, n_used: int) -> np.ndarray:
    """``selection`` with every expert outside each token's ``n_used`` best groups set to -inf."""
    n, n_expert = selection.shape
    grouped = selection.reshape(n, n_group, n_expert // n_group)
    best_two = -np.sort(-grouped, axis=-1)[..., :2]
    score = best_two.sum(axis=-1)
    kept = np.argsort(-score, axis=-1, kind="stable")[:, :n_used]
    mask = np.full((n, n_group), True)
    np.put_along_axis(mask, kept, False, axis=-1)
    return np.where(np.repeat(mask, n_expert // n_group, axis=-1), -np.inf, selection).astype(np.float32)


def route(
    logits: np.ndarray,
    k: int,
    normalise: bool,
    *,
    gating: str = "softmax",
    bias: np.ndarray | None = None,
    n_group: int = 0,
    n_group_used: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(experts, weights) for each token's router logits (tokens × experts), before any scaling."""
    p = _probabilities(logits, gating)
    selection = p + bias if bias is not None else p
    if n_group > 1:
        selection = _group_mask(selection, n_group, n_group_used)
    chosen = np.argsort(-selection, axis=-1, kind="stable")[..., :k]
    weights = np.take_along_axis(p, chosen, axis=-1)
    if normalise:
        weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), _MIN_SUM)
    return chosen, weights.astype(np.float32)


def route_layer(config: MoEConfig, logits: np.ndarray, bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`route` as ``config``'s architecture routes, the weights scaled by its ``weights_scale``."""
    chosen, weights = route(
        logits,
        config.n_expert_used,
        config.norm_topk,
        gating=config.gating,
        bias=bias,
        n_group=config.n_group,
        n_group_used=config.n_group_used,
    )
    return chosen, weights * np.float32(config.weights_scale)


def selection_scores(config: MoEConfig, logits: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """Scores that order the experts as the top-k choice does (groups aside): for the prefetcher's guess.

    Softmax logits order themselves; sigmoid probabilities with a bias do not, so they are computed.
    """
    if config.gating == "softmax" and bias is None:
        return logits
    p = _probabilities(logits, config.gating)
    return p + bias if bias is not None else p
