"""What kohra reads from a graph's inputs and outputs, and the graphs it refuses, on stand-in sessions."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from anyformer import AnyformerError, ErrorCode
from anyformer_kohra.denoiser import GraphRunner, RecomputedBlockDenoiser, inspect_graph


class _Session:
    """Just the parts of an onnxruntime session inspect_graph reads."""

    def __init__(self, inputs: list[tuple[str, str, list[object]]], outputs: list[str]) -> None:
        self._inputs = [SimpleNamespace(name=n, type=t, shape=s) for n, t, s in inputs]
        self._outputs = [SimpleNamespace(name=n) for n in outputs]

    def get_inputs(self) -> list[SimpleNamespace]:
        return self._inputs

    def get_outputs(self) -> list[SimpleNamespace]:
        return self._outputs


IDS = ("input_ids", "tensor(int64)", ["batch", "sequence"])


@pytest.mark.parametrize(
    ("mask_type", "dtype"),
    [
        ("tensor(float)", np.float32),
        ("tensor(float16)", np.float16),
        ("tensor(bool)", np.bool_),
        ("tensor(int64)", np.int64),
    ],
)
def test_a_4d_mask_of_each_type_makes_a_graph_that_can_recompute_blocks(mask_type: str, dtype: type) -> None:
    spec = inspect_graph(_Session([IDS, ("attention_mask", mask_type, ["b", 1, "q", "k"])], ["logits"]), {})
    assert spec.mask_is_4d and spec.can_recompute_blocks and not spec.has_cache
    assert spec.mask_dtype == dtype


def test_a_2d_mask_does_not_make_attention_block_causal() -> None:
    spec = inspect_graph(_Session([IDS, ("attention_mask", "tensor(int64)", ["b", "k"])], ["logits"]), {})
    assert not spec.mask_is_4d and not spec.can_recompute_blocks
    with pytest.raises(AnyformerError) as raised:
        RecomputedBlockDenoiser(GraphRunner(object(), spec), np.arange(3))
    assert raised.value.code == ErrorCode.BAD_MODEL and "4-D attention_mask" in raised.value.message


@pytest.mark.parametrize(
    ("mask", "words"),
    [
        (("attention_mask", "tensor(string)", ["b", 1, "q", "k"]), "type"),
        (("attention_mask", "tensor(float)", ["b", "q", "k"]), "rank 3"),
        (("token_type_ids", "tensor(int64)", ["b", "s"]), "does not know"),
    ],
)
def test_a_graph_with_an_input_kohra_cannot_feed_is_bad_model(mask: tuple[str, str, list[object]], words: str) -> None:
    with pytest.raises(AnyformerError) as raised:
        inspect_graph(_Session([IDS, mask], ["logits"]), {})
    assert raised.value.code == ErrorCode.BAD_MODEL and words in raised.value.message
