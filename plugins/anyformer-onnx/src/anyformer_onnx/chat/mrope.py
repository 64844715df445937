"""Multimodal rotary positions (M-RoPE) of Qwen2-VL-family decoders: ``position_ids`` of shape [3, batch, seq].

Each prompt position has three rotary indices: temporal, height and width. A text token has the
same index in all three rows, one more than the largest index before it. An image's tokens (one
per merged patch: ``t * (h / merge) * (w / merge)`` for a grid of ``t x h x w`` patches, laid out
row by row) all start from that same index ``s``: temporal row ``s + ti``, height row ``s + hi``,
width row ``s + wi``; the text after the image resumes at ``s + max(t, h / merge, w / merge)``
(for an image, whose ``t`` is 1, that is one past the largest index the image used).

The prompt's indices therefore end below its length; the difference, ``max + 1 - len(prompt)``
(the "rope delta", zero or negative), is added to the plain position of each token generated
after it, in all three rows. A prompt without images gets the plain positions in all three rows
and a delta of 0. This is what transformers' ``Qwen2VLModel.get_rope_index`` computes for one
unpadded sequence, and what transformers.js feeds a Qwen2-VL ``decoder_model_merged``.

Qwen3-VL and Qwen3.5 (``Qwen3_5Model.get_rope_index``) give an image the same rows: their rule
differs only for videos (one grid per frame, timestamps between them), which are not read. What
Qwen3.5 changes is inside the decoder: its rotary frequencies take the T, H and W rows interleaved
(``mrope_interleaved``: frequency ``i`` reads row H when ``i % 3 == 1`` and ``i < 3 *
mrope_section[1]``, row W when ``i % 3 == 2`` and ``i < 3 * mrope_section[2]``, row T otherwise)
where Qwen2-VL gives each row one contiguous section; an export does that in its graph, so the
rows fed are the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode

#: An image's grid of patches: (temporal, height, width), as the image processor's ``image_grid_thw``.
Grid = tuple[int, int, int]


def image_positions(start: int, grid: Grid, merge: int) -> np.ndarray:
    """The [3, n] rotary indices of one image's ``n`` tokens, starting at index ``start``."""
    t, h, w = grid[0], grid[1] // merge, grid[2] // merge
    # Tokens run over t, then rows, then columns (the vision encoder's merged-patch order).
    ti, hi, wi = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
    return np.stack([ti.ravel(), hi.ravel(), wi.ravel()]).astype(np.int64) + start


def rope_index(ids: Sequence[int], image_token: int, grids: Sequence[Grid], merge: int) -> tuple[np.ndarray, int]:
    """The [3, len(ids)] M-RoPE indices of a prompt and its rope delta (see the module docstring).

    Each run of consecutive ``image_token`` ids is one image, the next grid of ``grids`` in order;
    its length must be the grid's token count. ``BAD_REQUEST`` when runs and grids disagree (a
    prompt built for other images).
    """
    positions = np.zeros((3, len(ids)), dtype=np.int64)
    index = 0  # the next position in ids
    start = 0  # the next rotary index
    images = iter(grids)
    while index < len(ids):
        if ids[index] != image_token:
            end = index
            while end < len(ids) and ids[end] != image_token:
                end += 1
            positions[:, index:end] = np.arange(start, start + end - index)
            start += end - index
            index = end
            continue
        grid = next(images, None)
        if grid is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "the prompt holds more image token runs than images")
        count = grid[0] * (grid[1] // merge) * (grid[2] // merge)
        end = index
        while end < len(ids) and ids[end] == image_token:
            end += 1
        if end - index != count:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"an image run of the prompt is not the {count} tokens of grid {tuple(grid)}"
            )
        positions[:, index : index + count] = image_positions(start, grid, merge)
        start += max(grid[0], grid[1] // merge, grid[2] // merge)
        index += count
    if next(images, None) is not None:
        raise AnyformerError(ErrorCode.BAD_REQUEST, "fewer image token runs in the prompt than images")
    delta = int(positions.max()) + 1 - len(ids) if len(ids) else 0
    return positions, delta


def step_positions(first: int, count: int, delta: int) -> np.ndarray:
    """``position_ids`` [3, 1, count] for ``count`` tokens after the prompt, the first at plain position ``first``."""
    row = np.arange(first + delta, first + delta + count, dtype=np.int64)
    return np.broadcast_to(row, (3, 1, count)).copy()
