"""The KV cache can_run counts for a chat model: the layers that keep keys and values, at their widths.

Checked against the decoder graphs the fixtures exported (their ``past_key_values.N.key/value`` inputs
are what the loop holds per position) and on configs of the families whose layers differ.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from anyformer_onnx.estimate import kv_cache_bytes

_PAST = re.compile(r"^past_key_values\.\d+\.(key|value)$")


def _graph_floats_per_position(graph: Path) -> int:
    """Floats of keys and values the decoder graph's past inputs hold per position (static heads × width)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    return sum(int(i.shape[1]) * int(i.shape[3]) for i in session.get_inputs() if _PAST.match(i.name))


@pytest.mark.parametrize(
    ("fixture", "graph"),
    [
        ("tiny_llama_dir", "onnx/model.onnx"),
        ("gemma3n_dir", "onnx/decoder_model_merged.onnx"),
        ("qwen35_dir", "onnx/model.onnx"),
    ],
)
def test_the_estimate_counts_what_the_decoder_keeps(request: pytest.FixtureRequest, fixture: str, graph: str) -> None:
    """Per position, the estimate's bytes equal the graph's past entries: every layer of a llama; the first two
    of Gemma 3n's four (the last two share them); Qwen3.5's one full-attention layer of four."""
    folder: Path = request.getfixturevalue(fixture)
    path = folder / graph if (folder / graph).exists() else folder / graph.removeprefix("onnx/")
    config = json.loads((folder / "config.json").read_text())
    config = config.get("text_config", config)
    assert kv_cache_bytes(config, 100, 4) == _graph_floats_per_position(path) * 100 * 4


def test_gemma4s_full_attention_layers_count_their_global_head_width() -> None:
    config = {
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 64,
        "num_kv_shared_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"] * 3,
    }
    # Layers 0-3 keep KV: two sliding at 16 wide, two full at 64; layers 4 and 5 share.
    assert kv_cache_bytes(config, 10, 2) == 2 * 2 * (16 + 64 + 16 + 64) * 10 * 2


def test_lfm2s_convolution_layers_keep_no_kv() -> None:
    config = {
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 64,
        "layer_types": ["conv", "conv", "full_attention", "conv"],
    }
    assert kv_cache_bytes(config, 10, 4) == 2 * 2 * 16 * 10 * 4
