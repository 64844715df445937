"""The masks kohra builds for a graph's 4-D attention_mask: segments, block-causality, each type's encoding."""

from __future__ import annotations

import numpy as np
import pytest

from anyformer_kohra.attention_masks import block_causal, block_segments, encode_mask, full_mask, mask_bytes


def test_segments_are_the_prompt_then_one_per_block() -> None:
    assert block_segments(3, [2, 2, 1]).tolist() == [0, 0, 0, 1, 1, 2, 2, 3]
    assert block_segments(0, [2]).tolist() == [1, 1]


def test_a_position_sees_its_own_segment_and_the_earlier_ones() -> None:
    allowed = block_causal(block_segments(2, [2, 2]))
    want = np.array(
        [
            [1, 1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1, 1],
        ],
        dtype=bool,
    )
    assert np.array_equal(allowed, want)


@pytest.mark.parametrize(
    ("dtype", "allowed_value", "blocked_value"),
    [
        (np.float32, 0.0, np.finfo(np.float32).min),
        (np.float16, 0.0, np.finfo(np.float16).min),
        (np.bool_, True, False),
        (np.int64, 1, 0),
    ],
)
def test_each_mask_type_is_encoded_as_graphs_expect(dtype: type, allowed_value: object, blocked_value: object) -> None:
    allowed = np.array([[True, False], [True, True]])
    encoded = encode_mask(allowed, dtype)
    assert encoded.shape == (1, 1, 2, 2) and encoded.dtype == np.dtype(dtype)
    assert encoded[0, 0, 0, 0] == allowed_value and encoded[0, 0, 1, 1] == allowed_value
    assert encoded[0, 0, 0, 1] == blocked_value
    assert np.isfinite(encoded.astype(np.float64)).all()


def test_a_full_mask_lets_every_query_see_every_key() -> None:
    mask = full_mask(2, 5, np.float16)
    assert mask.shape == (1, 1, 2, 5) and not mask.any()


def test_mask_bytes_counts_the_bool_matrix_and_its_encoding() -> None:
    assert mask_bytes(3, 5, np.float32) == 3 * 5 * 5
    assert mask_bytes(3, 5, np.float16) == 3 * 5 * 3
    allowed = block_causal(block_segments(2, [3]))
    assert mask_bytes(5, 5, np.float32) == allowed.nbytes + encode_mask(allowed, np.float32).nbytes
