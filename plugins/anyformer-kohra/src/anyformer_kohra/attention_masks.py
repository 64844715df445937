"""The attention masks kohra feeds a graph with a 4-D ``attention_mask`` input: full, or block-causal.

A graph's 4-D mask is ``[batch, 1, query, key]``, encoded by the input's type: a float mask is
additive (0 where a query may attend, the type's most negative finite value where not, as Hugging
Face exports build it), a bool mask is True where a query may attend, an integer mask 1 where it
may. Block-causal attention (BD3LM without a key/value cache) splits the sequence into segments,
the prompt first, then one segment per block, and lets a position attend to its own segment and
every earlier one: a block never sees a later block, so a finished block's states stay what they
were when it was finished.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def encode_mask(allowed: np.ndarray, dtype: Any) -> np.ndarray:
    """``allowed`` (bool ``[query, key]``) as the graph's ``[1, 1, query, key]`` mask of ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        encoded = allowed.copy()
    elif np.issubdtype(dtype, np.floating):
        # The most negative finite value, not -inf: an fp16 graph adds it to fp16 scores, and -inf - inf
        # arithmetic in a fused kernel gives NaN where a finite floor only saturates.
        encoded = np.where(allowed, 0.0, np.finfo(dtype).min).astype(dtype)
    else:
        encoded = allowed.astype(dtype)
    return encoded[None, None]


def mask_bytes(queries: int, keys: int, dtype: Any) -> int:
    """The memory one ``[queries, keys]`` mask takes while it is built: the bool matrix and its encoding."""
    return queries * keys * (1 + np.dtype(dtype).itemsize)


def full_mask(queries: int, keys: int, dtype: Any) -> np.ndarray:
    """Every query attends to every key: the mask of a bidirectional call or of a block against its cache."""
    return encode_mask(np.ones((queries, keys), dtype=bool), dtype)


def block_segments(prompt_length: int, block_lengths: list[int]) -> np.ndarray:
    """Each position's segment: 0 for the prompt, then 1, 2, ... for the blocks after it, in order."""
    parts = [np.zeros(prompt_length, dtype=np.int64)]
    parts += [np.full(length, index + 1, dtype=np.int64) for index, length in enumerate(block_lengths)]
    return np.concatenate(parts)


def block_causal(segments: np.ndarray) -> np.ndarray:
    """Bool ``[n, n]``: position i may attend to position j when j's segment is not after i's."""
    return segments[None, :] <= segments[:, None]
