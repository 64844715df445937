"""What the decode loop accepts from a graph's inputs and outputs (a stand-in session; no model needed)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx.chat.decoder import DecoderGraph


@dataclass
class _Arg:
    name: str
    shape: list[object] = field(default_factory=list)
    type: str = "tensor(int64)"


class _Session:
    def __init__(self, inputs: list[_Arg], outputs: list[str]) -> None:
        self._inputs, self._outputs = inputs, [_Arg(n) for n in outputs]

    def get_inputs(self) -> list[_Arg]:
        return self._inputs

    def get_outputs(self) -> list[_Arg]:
        return self._outputs


def _kv(layers: int, dtype: str = "tensor(float)", shape: list[object] | None = None) -> list[_Arg]:
    return [
        _Arg(f"past_key_values.{i}.{part}", shape or ["batch", 2, "past", 16], dtype)
        for i in range(layers)
        for part in ("key", "value")
    ]


def _presents(layers: int) -> list[str]:
    return [f"present.{i}.{part}" for i in range(layers) for part in ("key", "value")]


def test_optimum_names_are_read_in_layer_order() -> None:
    inputs = [_Arg("input_ids"), _Arg("attention_mask"), _Arg("position_ids"), *reversed(_kv(11))]
    graph = DecoderGraph(_Session(inputs, ["logits", *_presents(11)]), {}, "g")
    assert graph.past_names[:3] == ["past_key_values.0.key", "past_key_values.0.value", "past_key_values.1.key"]
    assert graph.past_names[-1] == "past_key_values.10.value"
    assert graph.present_names == [n.replace("past_key_values", "present") for n in graph.past_names]
    assert graph.kv_shape == (2, 16)
    assert graph.kv_dtype is np.float32
    assert graph.has_mask and graph.has_positions and graph.logits_to_keep is None


def test_fp16_cache_and_shape_from_config() -> None:
    inputs = [_Arg("input_ids"), _Arg("num_logits_to_keep"), *_kv(2, "tensor(float16)", ["b", "h", "p", "d"])]
    config = {"num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    graph = DecoderGraph(_Session(inputs, ["logits", *_presents(2)]), config, "g")
    assert graph.kv_shape == (3, 64)
    assert graph.kv_dtype is np.float16
    assert graph.logits_to_keep == "num_logits_to_keep"
    assert not graph.has_mask


@pytest.mark.parametrize(
    ("inputs", "outputs", "fault"),
    [
        ([_Arg("pixel_values")], ["logits"], "not a decoder graph"),
        ([_Arg("input_ids"), _Arg("encoder_hidden_states")], ["logits"], "encoder_hidden_states"),
        ([_Arg("input_ids"), *_kv(2)], ["logits", "present.0.key"], "past_key_values.0.value"),
        ([_Arg("input_ids"), *_kv(1, "tensor(int8)")], ["logits", *_presents(1)], "tensor(int8)"),
        ([_Arg("input_ids"), *_kv(1, shape=["b", "h", "p", "d"])], ["logits", *_presents(1)], "head count"),
    ],
)
def test_graphs_the_loop_cannot_feed_are_bad_model(inputs: list[_Arg], outputs: list[str], fault: str) -> None:
    with pytest.raises(AnyformerError) as caught:
        DecoderGraph(_Session(inputs, outputs), {}, "g")
    assert caught.value.code == ErrorCode.BAD_MODEL
    assert fault in caught.value.message


def test_each_cache_entry_keeps_its_own_head_size() -> None:
    """Gemma 4: full-attention layers have a wider head; the graph's dims, else config's global_head_dim."""
    from anyformer_onnx.chat.decoder import DecodeLoop

    inputs = [_Arg("inputs_embeds"), _Arg("per_layer_inputs")]
    inputs += [_Arg(f"past_key_values.0.{p}", ["b", 1, "p", 256], "tensor(float)") for p in ("key", "value")]
    inputs += [_Arg(f"past_key_values.1.{p}", ["b", 1, "p", 512], "tensor(float)") for p in ("key", "value")]
    inputs += [_Arg(f"past_key_values.2.{p}", ["b", "h", "p", "d"], "tensor(float)") for p in ("key", "value")]
    config = {
        "num_key_value_heads": 1,
        "head_dim": 256,
        "global_head_dim": 512,
        "layer_types": ["sliding_attention", "full_attention", "full_attention"],
    }
    graph = DecoderGraph(_Session(inputs, ["logits", *_presents(3)]), config, "g")
    assert graph.per_layer
    assert [graph.kv_shapes[f"past_key_values.{i}.key"] for i in range(3)] == [(1, 256), (1, 512), (1, 512)]
    cache = DecodeLoop(graph, "cpu", lambda ids: {}).empty_cache()
    assert [tuple(cache[f"past_key_values.{i}.value"].shape()) for i in range(3)] == [
        (1, 1, 0, 256),
        (1, 1, 0, 512),
        (1, 1, 0, 512),
    ]


@pytest.mark.parametrize("state", ["past_ssm.1", "past_conv.0.key"])
def test_states_the_loop_does_not_carry_are_refused_by_name(state: str) -> None:
    """Mamba hybrids' past_ssm, OLMo-hybrid's split convolution states: BAD_MODEL naming the state."""
    inputs = [_Arg("input_ids"), *_kv(1), _Arg(state, ["b", 8, 4], "tensor(float)")]
    with pytest.raises(AnyformerError) as caught:
        DecoderGraph(_Session(inputs, ["logits", *_presents(1)]), {}, "g")
    assert caught.value.code == ErrorCode.BAD_MODEL
    assert state in caught.value.message and "cache state this loop does not carry" in caught.value.message


def test_linear_attention_states_are_carried_with_config_shapes() -> None:
    """Qwen3.5's past_conv.i / past_recurrent.i: paired with their presents, zeros of config.json's sizes."""
    inputs = [_Arg("input_ids"), _Arg("past_conv.0", ["b", "c", "k"], "tensor(float)")]
    inputs += [_Arg("past_recurrent.0", ["b", "h", "dk", "dv"], "tensor(float16)"), *_kv(1)]
    config = {
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_num_value_heads": 4,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
    }
    outputs = ["logits", "present_conv.0", "present_recurrent.0", *_presents(1)]
    graph = DecoderGraph(_Session(inputs, outputs), config, "g")
    assert graph.carried == ["past_key_values.0.key", "past_key_values.0.value", "past_conv.0", "past_recurrent.0"]
    assert graph.returned == ["present.0.key", "present.0.value", "present_conv.0", "present_recurrent.0"]
    assert [(s.shape, s.dtype) for s in graph.states] == [((1, 96, 4), np.float32), ((1, 4, 16, 8), np.float16)]
    with pytest.raises(AnyformerError) as caught:  # sizes neither in the graph nor in config.json
        DecoderGraph(_Session(inputs, outputs), {}, "g")
    assert "past_conv.0" in caught.value.message
    with pytest.raises(AnyformerError) as caught:  # a state with nothing to carry it on
        DecoderGraph(_Session(inputs, outputs[:2] + outputs[3:]), config, "g")
    assert "present_recurrent.0" in caught.value.message


def test_per_layer_inputs_need_an_embeddings_graph() -> None:
    inputs = [_Arg("input_ids"), _Arg("per_layer_inputs"), *_kv(1)]
    with pytest.raises(AnyformerError) as caught:
        DecoderGraph(_Session(inputs, ["logits", *_presents(1)]), {}, "g")
    assert caught.value.code == ErrorCode.BAD_MODEL
    assert "per-layer inputs" in caught.value.message
