"""The GroupQueryAttention rewrite of traced decoders: what it changes, that it computes the same, and its cache.

The reference for "the same" is the exported graph itself on onnxruntime (logits on a prompt and
decode steps), and torch for the greedy replies (the fixtures' recorded replies); the rotary tables
are compared with transformers' own rope initialisers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper

import anyformer
from anyformer_onnx.chat.decoder import DecodeLoop, DecoderGraph
from anyformer_onnx.chat.handle import OnnxChatModel
from anyformer_onnx.chat.sampling import Sampler
from anyformer_onnx.rewrite import fused_graph
from anyformer_onnx.rewrite.attention_fusion import NotFusable, attention_shape, fuse_attention, inverse_frequencies
from anyformer_onnx.rewrite.cache_branch import reduce_to_with_past
from anyformer_onnx.rewrite.fused_graph import prepare_decoder
from anyformer_onnx.rewrite.fused_store import fused_entries
from anyformer_onnx.rewrite.mlp_fusion import split_gate_up
from anyformer_onnx.rewrite.norm_fusion import fuse_norms


def _config(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return data


def _logits(model: onnx.ModelProto, config: dict[str, Any], ids: list[int], steps: int) -> list[np.ndarray]:
    """Last-position logits of ``ids`` then of ``steps`` greedy tokens, on onnxruntime."""
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    loop = DecodeLoop(DecoderGraph(session, config, "test"), "cpu")
    rows, cache, total = [], loop.empty_cache(), 0
    for _ in range(steps + 1):
        total += len(ids)
        row, cache = loop.step(ids, total, cache)
        rows.append(row)
        ids = [int(row.argmax())]
    return rows


def _no_progress(_event: Any) -> None:
    return None


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "anyformer-home"
    monkeypatch.setenv("ANYFORMER_HOME", str(folder))
    return folder


def _assert_greedy_ids_equal_torch(handle: OnnxChatModel, replies: list[dict[str, Any]]) -> None:
    """Token ids in, token ids out: each reference prompt's greedy continuation equals torch's ids."""
    for reply in replies:
        ids = handle.loop.tokens(
            reply["prompt_ids"],
            Sampler(0.0, 0, 1.0, None),
            limit=len(reply["reply_ids"]),
            stop_ids=handle.text.eos_ids,
        )
        assert list(ids) == reply["reply_ids"]


def test_rewrite_replaces_each_layers_attention_and_computes_the_same(tiny_llama_dir: Path) -> None:
    config = _config(tiny_llama_dir)
    exported = onnx.load(str(tiny_llama_dir / "onnx" / "model.onnx"))
    fused = onnx.load(str(tiny_llama_dir / "onnx" / "model.onnx"))
    report = fuse_attention(fused, config)
    assert fuse_norms(fused, config) == 2 * 2
    kinds = [n.op_type for n in fused.graph.node]
    # Every norm after the first (of the embeddings, left to onnxruntime) absorbs the residual add before it.
    assert kinds.count("SkipSimplifiedLayerNormalization") == 4 and kinds.count("ReduceMean") == 1
    assert kinds.count("Add") == 1  # the epsilon inside the embeddings' norm
    assert report.layers == 2 and kinds.count("GroupQueryAttention") == 2
    assert report.packed_qkv == 2 and kinds.count("MatMul") == 2 * 5 + 1  # qkv, o, gate, up, down; lm_head
    assert len(kinds) < report.nodes_after < report.nodes_before / 3
    # The rotary slices, the mask and the repeated key/value heads are gone; the interface is kept
    # except position_ids, which GroupQueryAttention no longer reads.
    assert "Neg" not in kinds and "Expand" not in kinds and "Softmax" not in kinds
    assert [o.name for o in fused.graph.output] == [o.name for o in exported.graph.output]
    assert {i.name for i in exported.graph.input} - {i.name for i in fused.graph.input} == {"position_ids"}
    onnx.checker.check_model(fused)
    ids = [5, 17, 42, 8, 63, 21, 9, 30]
    for want, got in zip(_logits(exported, config, ids, 6), _logits(fused, config, ids, 6), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))
        assert got.argmax() == want.argmax()


def test_rotary_frequencies_equal_transformers() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cases = [
        ({"rope_type": "default", "rope_theta": 500000.0}, "default"),
        ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, "linear"),
        (
            {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "llama3",
        ),
    ]
    for parameters, kind in cases:
        config = LlamaConfig(hidden_size=512, num_attention_heads=8, max_position_embeddings=131072)
        config.rope_parameters = dict(parameters)
        ours = inverse_frequencies(config.to_dict(), 64)
        if kind == "default":
            want = 1.0 / (parameters["rope_theta"] ** (np.arange(0, 64, 2) / 64))
        else:
            want = ROPE_INIT_FUNCTIONS[kind](config, "cpu")[0].numpy()
        np.testing.assert_allclose(ours, want, rtol=1e-6)
    # transformers 4's spelling reads the same
    old_style = {"rope_theta": 500000.0, "rope_scaling": dict(cases[2][0], rope_type="llama3")}
    np.testing.assert_allclose(
        inverse_frequencies(old_style, 64), inverse_frequencies({"rope_parameters": cases[2][0]}, 64)
    )


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"model_type": "gpt2"}, "model_type"),
        ({"model_type": "mistral", "sliding_window": 4096}, "sliding-window"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "rotary type"),
        ({"partial_rotary_factor": 0.5}, "partial rotary"),
        ({"num_key_value_heads": 3}, "head counts"),
        ({"head_dim": 10**8}, "beyond"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}, "unreadable: KeyError"),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 0}}, "unreadable"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": "x"}}, "unreadable"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": -5.0}}, "unreadable"),
    ],
)
def test_configs_it_does_not_compute_are_refused(tiny_llama_dir: Path, change: dict[str, Any], reason: str) -> None:
    config = _config(tiny_llama_dir) | change
    with pytest.raises(NotFusable, match=reason):
        attention_shape(config)


def test_graph_without_the_projection_names_is_left_alone(tiny_llama_dir: Path) -> None:
    model = onnx.load(str(tiny_llama_dir / "onnx" / "model.onnx"))
    for index, node in enumerate(model.graph.node):
        node.name = f"n{index}"
    before = model.SerializeToString()
    with pytest.raises(NotFusable, match="no q_proj nodes"):
        fuse_attention(model, _config(tiny_llama_dir))
    assert model.SerializeToString() == before


def test_first_load_writes_the_cache_and_the_next_reads_it(tiny_llama_dir: Path, home: Path, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, folder)
    graph = folder / "onnx" / "model.onnx"
    before = sorted(p.name for p in folder.rglob("*"))
    events: list[Any] = []
    config = _config(folder)
    first = prepare_decoder(graph, config, repo=None, context=512, progress=events.append, label="tiny")
    assert first.fused and first.path.parent.parent == home / "onnx" / "local" / "fused"
    assert [(e.stage, e.done, e.total) for e in events] == [("fuse", 0, 1), ("fuse", 1, 1)]
    assert events[0].message == fused_graph.FUSING and events[1].message == first.note
    assert sorted(p.name for p in first.path.parent.iterdir()) == ["fusion.json", "model.onnx", "model.onnx.data"]
    assert sorted(p.name for p in folder.rglob("*")) == before, "nothing is written into the model's folder"
    assert not list(first.path.parent.parent.glob(".*partial"))

    def never(*_args: Any) -> Any:
        raise AssertionError("the cached graph was made again")

    again = prepare_decoder(graph, config, repo=None, context=512, progress=never, label="tiny")
    assert again == first
    # A changed file is another source: the key follows the file's identity.
    os.utime(graph, ns=(graph.stat().st_atime_ns, graph.stat().st_mtime_ns + 10**9))
    changed = prepare_decoder(graph, config, repo=None, context=512, progress=_no_progress, label="tiny")
    assert changed.fused and changed.path != first.path


def test_odd_repo_ids_stay_inside_the_backends_folder(home: Path) -> None:
    for repo in ("../../etc", "a/../../b", "local/x", "a/b/c", "a\\b/c"):
        assert fused_graph.cache_folder(repo, "k") == home / "onnx" / "local" / "fused" / "k"
    assert fused_graph.cache_folder("org/name", "k") == home / "onnx" / "org" / "name" / "fused" / "k"


def test_an_interrupted_builds_leftovers_are_removed(tiny_llama_dir: Path, home: Path) -> None:
    graph = tiny_llama_dir / "onnx" / "model.onnx"
    config = _config(tiny_llama_dir)
    folder = fused_graph.cache_folder(None, fused_graph.cache_key(graph, config))
    stale, fresh = folder.with_name(f".{folder.name}.1.partial"), folder.with_name(f".{folder.name}.2.partial")
    for leftover in (stale, fresh):
        (leftover / "sub").mkdir(parents=True)
    os.utime(stale, (0, 0))
    assert prepare_decoder(graph, config, repo=None, context=512, progress=_no_progress, label="t").fused
    assert not stale.exists() and fresh.exists()  # a build still running elsewhere is left alone


def test_fused_graphs_are_kept_by_repo_and_listed_for_the_store(tiny_llama_dir: Path, home: Path) -> None:
    graph = tiny_llama_dir / "onnx" / "model.onnx"
    prepared = prepare_decoder(
        graph, _config(tiny_llama_dir), repo="org/tiny", context=512, progress=_no_progress, label="t"
    )
    assert prepared.path.parents[2] == home / "onnx" / "org" / "tiny"
    local = prepare_decoder(graph, _config(tiny_llama_dir), repo=None, context=512, progress=_no_progress, label="t")
    # A graph left as exported is recorded but is no stored model.
    odd = _config(tiny_llama_dir) | {"rope_parameters": {"rope_type": "default", "rope_theta": 77.0}}
    assert not prepare_decoder(graph, odd, repo=None, context=512, progress=_no_progress, label="t").fused
    listed = {(e.repo, e.path) for e in fused_entries()}
    assert listed == {("org/tiny", str(prepared.path.parent)), (str(graph), str(local.path.parent))}
    assert all(e.bytes == sum(p.stat().st_size for p in Path(e.path).iterdir()) for e in fused_entries())


def test_rm_of_a_local_model_removes_its_fused_graphs_and_keeps_its_files(tiny_llama_dir: Path, home: Path) -> None:
    graph = tiny_llama_dir / "onnx" / "model.onnx"
    before = graph.read_bytes()
    local = prepare_decoder(graph, _config(tiny_llama_dir), repo=None, context=512, progress=_no_progress, label="t")
    hub = prepare_decoder(
        graph, _config(tiny_llama_dir), repo="org/tiny", context=512, progress=_no_progress, label="t"
    )
    done = subprocess.run(
        [sys.executable, "-m", "anyformer", "rm", str(tiny_llama_dir), "-y"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert not local.path.parent.exists() and hub.path.exists()  # the Hub repo's graph is not the local model's
    assert graph.read_bytes() == before
    assert [e.repo for e in fused_entries()] == ["org/tiny"]


def test_a_rewrite_the_proof_rejects_falls_back_and_is_remembered(
    tiny_llama_dir: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A wrong rotary base in the table: the rewrite matches, its logits do not.
    config = _config(tiny_llama_dir) | {"rope_parameters": {"rope_type": "default", "rope_theta": 77.0}}
    graph = tiny_llama_dir / "onnx" / "model.onnx"
    prepared = prepare_decoder(graph, config, repo=None, context=512, progress=_no_progress, label="t")
    assert not prepared.fused and prepared.path == graph
    assert "logits differ" in prepared.note
    record = next(home.rglob("fusion.json"))
    assert sorted(p.name for p in record.parent.iterdir()) == ["fusion.json"]
    monkeypatch.setattr(fused_graph, "_build", lambda *_args: pytest.fail("the rejected rewrite was made again"))
    assert prepare_decoder(graph, config, repo=None, context=512, progress=_no_progress, label="t") == prepared


def test_a_context_past_the_rotary_table_uses_the_export(tiny_llama_dir: Path, home: Path) -> None:
    graph = tiny_llama_dir / "onnx" / "model.onnx"
    prepared = prepare_decoder(
        graph, _config(tiny_llama_dir), repo=None, context=4096, progress=_no_progress, label="t"
    )
    assert not prepared.fused and "rotary positions" in prepared.note
    assert not home.exists() or not list(home.rglob("fusion.json"))


def test_too_little_memory_uses_the_export_without_reading_it(
    tiny_llama_dir: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fused_graph, "host_ram_available", lambda: 1000)
    monkeypatch.setattr(fused_graph, "_build", lambda *_args: pytest.fail("built without the memory for it"))
    graph = tiny_llama_dir / "onnx" / "model.onnx"
    prepared = prepare_decoder(graph, _config(tiny_llama_dir), repo=None, context=512, progress=_no_progress, label="t")
    assert not prepared.fused and "memory" in prepared.note


def test_a_failed_write_leaves_no_folder_and_uses_the_export(
    tiny_llama_dir: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(onnx, "save_model", full)
    graph = tiny_llama_dir / "onnx" / "model.onnx"
    prepared = prepare_decoder(graph, _config(tiny_llama_dir), repo=None, context=512, progress=_no_progress, label="t")
    assert not prepared.fused and prepared.path == graph and "No space left" in prepared.note
    assert not [p for p in home.rglob("*") if p.is_file() and "fused" in p.parts]


def test_fuse_attention_false_loads_the_export_and_replies_equal_torch(tiny_llama_dir: Path, reference: Any) -> None:
    with anyformer.load(str(tiny_llama_dir), backend="onnx", options={"fuse_attention": "false"}) as loaded:
        handle = loaded.handle
        assert isinstance(handle, OnnxChatModel)
        assert "graph" not in handle.details
        assert handle.loop.graph.has_positions  # the exported graph, position_ids and all
        _assert_greedy_ids_equal_torch(handle, reference(tiny_llama_dir)["replies"])


def test_qwen2_with_biased_projections_fuses_and_replies_equal_torch(tiny_qwen2_dir: Path, reference: Any) -> None:
    with anyformer.load(str(tiny_qwen2_dir), backend="onnx") as loaded:
        handle = loaded.handle
        assert isinstance(handle, OnnxChatModel)
        # Biased projections are two nodes each: q, k and v stay apart, the attention is fused.
        assert handle.details["graph"].startswith(
            "attention fused into GroupQueryAttention (2 layers, q/k/v packed in 0"
        )
        assert not handle.loop.graph.has_positions
        # Token ids in, token ids out: the numerics of the graph (torch's tokenizer class for Qwen2
        # splits the character vocabulary's chat prompt otherwise, which is not what is tested here).
        _assert_greedy_ids_equal_torch(handle, reference(tiny_qwen2_dir)["replies"])


def test_int8_dynamic_quantized_graph_fuses_through_its_quantize_node(
    tiny_llama_dir: Path, home: Path, tmp_path: Path
) -> None:
    # transformers.js's int8 exports (model_quantized.onnx): quantize_dynamic puts a DynamicQuantizeLinear
    # of the attention's output in front of o_proj; that node is what the fused attention feeds.
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder = tmp_path / "int8"
    shutil.copytree(tiny_llama_dir, folder)
    graph = folder / "onnx" / "model_quantized.onnx"
    quantize_dynamic(
        folder / "onnx" / "model.onnx", graph, weight_type=QuantType.QUInt8, op_types_to_quantize=["MatMul"]
    )
    (folder / "onnx" / "model.onnx").unlink()
    exported = onnx.load(str(graph))
    assert "DynamicQuantizeLinear" in {n.op_type for n in exported.graph.node}
    prepared = prepare_decoder(graph, _config(folder), repo=None, context=512, progress=_no_progress, label="t")
    assert prepared.fused, prepared.note
    fused = onnx.load(str(prepared.path))
    assert [n.op_type for n in fused.graph.node].count("GroupQueryAttention") == 2
    config = _config(folder)
    ids = [5, 17, 42, 8, 63, 21, 9, 30]
    for want, got in zip(_logits(exported, config, ids, 4), _logits(fused, config, ids, 4), strict=True):
        # int8 activations: the attention's last bits can flip a rounding of its quantized output.
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 * max(1.0, float(np.abs(want).max())))


def test_int4_graph_packs_q_k_v_and_keeps_its_accuracy_level(tiny_llama_dir: Path, home: Path, tmp_path: Path) -> None:
    # onnxruntime's MatMulNBits quantizer at accuracy level 4 (int8 compute), as the bench's int4 graphs.
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    folder = tmp_path / "int4"
    shutil.copytree(tiny_llama_dir, folder)
    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(folder / "onnx" / "model.onnx")), block_size=16, is_symmetric=True, accuracy_level=4
    )
    quantizer.process()
    graph = folder / "onnx" / "model_q4.onnx"
    quantizer.model.save_model_to_file(str(graph), use_external_data_format=False)
    exported = onnx.load(str(graph))
    prepared = prepare_decoder(graph, _config(folder), repo=None, context=512, progress=_no_progress, label="t")
    assert prepared.fused, prepared.note
    fused = onnx.load(str(prepared.path))
    matmuls = [n for n in fused.graph.node if n.op_type == "MatMulNBits"]
    assert len(matmuls) == 2 * 5 + 1 and sum("qkv_proj" in n.name for n in matmuls) == 2
    # The proof ran every MatMulNBits at level 1; the graph that is kept computes as the export did.
    levels = {a.i for n in matmuls for a in n.attribute if a.name == "accuracy_level"}
    assert levels == {4}
    packed = next(n for n in matmuls if "qkv_proj" in n.name)
    assert {a.name: helper.get_attribute_value(a) for a in packed.attribute}["N"] == 4 * 16 + 2 * 2 * 16
    # At level 1 the fused and exported graphs agree as the fp32 ones do (the same packed weights).
    for model in (exported, fused):
        for node in model.graph.node:
            for attribute in node.attribute:
                if node.op_type == "MatMulNBits" and attribute.name == "accuracy_level":
                    attribute.i = 1
    config = _config(folder)
    ids = [5, 17, 42, 8, 63, 21, 9, 30]
    for want, got in zip(_logits(exported, config, ids, 4), _logits(fused, config, ids, 4), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def test_qwen3_keeps_its_q_k_norms_before_the_fused_attention_and_computes_the_same(tiny_qwen3_dir: Path) -> None:
    config = _config(tiny_qwen3_dir)
    exported = onnx.load(str(tiny_qwen3_dir / "onnx" / "model.onnx"))
    fused = onnx.load(str(tiny_qwen3_dir / "onnx" / "model.onnx"))
    report = fuse_attention(fused, config)
    assert fuse_norms(fused, config) == 2 * 2
    kinds = [n.op_type for n in fused.graph.node]
    assert report.layers == 2 and kinds.count("GroupQueryAttention") == 2
    # One norm over the head size for q and one for k in each layer, fed by the projection's heads.
    norms = [n for n in fused.graph.node if n.op_type == "SimplifiedLayerNormalization"]
    assert len(norms) == 2 * 2 and all(n.input[1].endswith(("q_norm.weight", "k_norm.weight")) for n in norms)
    assert "Neg" not in kinds and "Softmax" not in kinds and "Transpose" not in kinds
    assert report.nodes_after < report.nodes_before / 4
    ids = [5, 17, 42, 8, 63, 21, 9, 30]
    for want, got in zip(_logits(exported, config, ids, 6), _logits(fused, config, ids, 6), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))
        assert got.argmax() == want.argmax()


def test_qwen3_fuses_on_load_and_replies_equal_torch(tiny_qwen3_dir: Path, reference: Any, home: Path) -> None:
    with anyformer.load(str(tiny_qwen3_dir), backend="onnx") as loaded:
        handle = loaded.handle
        assert isinstance(handle, OnnxChatModel)
        assert handle.details["graph"].startswith("attention fused into GroupQueryAttention (2 layers")
        assert not handle.loop.graph.has_positions
        _assert_greedy_ids_equal_torch(handle, reference(tiny_qwen3_dir)["replies"])


def test_the_proof_rejects_a_qwen3_rewrite_without_its_q_k_norms(
    tiny_qwen3_dir: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The norms are what separates Qwen3's attention from Qwen2's: left out, the probe must see it.
    from anyformer_onnx.rewrite import attention_fusion

    monkeypatch.setattr(attention_fusion, "_qk_norms", lambda *_args: {})
    graph = tiny_qwen3_dir / "onnx" / "model.onnx"
    prepared = prepare_decoder(graph, _config(tiny_qwen3_dir), repo=None, context=256, progress=_no_progress, label="t")
    assert not prepared.fused and prepared.path == graph and "logits differ" in prepared.note


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"model_type": "qwen2"}, "a q norm, which this model_type does not have"),
        ({"rms_norm_eps": None}, "no rms_norm_eps"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
        ({"use_sliding_window": True, "sliding_window": 64}, "sliding-window"),
    ],
)
def test_qwen3_layouts_it_does_not_compute_are_refused(
    tiny_qwen3_dir: Path, change: dict[str, Any], reason: str
) -> None:
    model = onnx.load(str(tiny_qwen3_dir / "onnx" / "model.onnx"))
    before = model.SerializeToString()
    with pytest.raises(NotFusable, match=reason):
        fuse_attention(model, _config(tiny_qwen3_dir) | change)
    assert model.SerializeToString() == before


def _quantized(folder: Path, kind: str) -> Path:
    """``folder`` holding its graph as int8 (quantize_dynamic) or int4 (MatMulNBits, level 4)."""
    source = folder / "onnx" / "model.onnx"
    if kind == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        graph = folder / "onnx" / "model_quantized.onnx"
        quantize_dynamic(source, graph, weight_type=QuantType.QUInt8, op_types_to_quantize=["MatMul"])
    else:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        graph = folder / "onnx" / "model_q4.onnx"
        quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), block_size=16, is_symmetric=True, accuracy_level=4)
        quantizer.process()
        quantizer.model.save_model_to_file(str(graph), use_external_data_format=False)
    source.unlink()
    return graph


@pytest.mark.parametrize("fixture", ["tiny_qwen3_dir", "tiny_phi3_dir"])
@pytest.mark.parametrize(("kind", "tolerance"), [("int8", 2e-2), ("int4", 1e-5)])
def test_quantized_qwen3_and_phi3_graphs_fuse_and_compute_as_exported(
    request: pytest.FixtureRequest, home: Path, tmp_path: Path, fixture: str, kind: str, tolerance: float
) -> None:
    folder = tmp_path / kind
    shutil.copytree(request.getfixturevalue(fixture), folder)
    graph = _quantized(folder, kind)
    exported = onnx.load(str(graph))
    config = _config(folder)
    prepared = prepare_decoder(graph, config, repo=None, context=256, progress=_no_progress, label="t")
    assert prepared.fused, prepared.note
    fused = onnx.load(str(prepared.path))
    kinds = [n.op_type for n in fused.graph.node]
    qk_norms = 4 if fixture == "tiny_qwen3_dir" else 0
    assert kinds.count("GroupQueryAttention") == 2 and kinds.count("SimplifiedLayerNormalization") == qk_norms
    # Phi-3's gate_up chunk becomes a Split where the projection's width is readable (int4: N).
    assert kinds.count("Split") == (2 if fixture == "tiny_phi3_dir" and kind == "int4" else 0)
    for model in (exported, fused):  # int4: compare at level 1 (fp32 compute), as the proof does
        for node in model.graph.node:
            for attribute in node.attribute:
                if node.op_type == "MatMulNBits" and attribute.name == "accuracy_level":
                    attribute.i = 1
    ids = [5, 17, 42, 8, 63, 21, 9, 30]
    for want, got in zip(_logits(exported, config, ids, 4), _logits(fused, config, ids, 4), strict=True):
        # int8: the attention's last bits can flip a rounding of its quantized output.
        np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * max(1.0, float(np.abs(want).max())))


def _merged(folder: Path) -> onnx.ModelProto:
    return onnx.load(str(folder / "decoder_model_merged.onnx"))


def test_a_merged_decoder_is_its_with_past_branch_for_the_loop(tiny_llama_merged_dir: Path) -> None:
    # The loop feeds use_cache_branch false only on the first step, with a past of zero positions:
    # there the with-past branch must compute what the export's no-past branch computes.
    config = _config(tiny_llama_merged_dir)
    exported, reduced = _merged(tiny_llama_merged_dir), _merged(tiny_llama_merged_dir)
    assert reduce_to_with_past(reduced)
    assert "If" not in {n.op_type for n in reduced.graph.node}
    assert "use_cache_branch" not in {i.name for i in reduced.graph.input}
    assert [o.name for o in reduced.graph.output] == [o.name for o in exported.graph.output]
    onnx.checker.check_model(reduced)
    ids = [5, 17, 42, 8, 63, 21, 9, 30]
    for want, got in zip(_logits(exported, config, ids, 4), _logits(reduced, config, ids, 4), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))
    # A graph without the input is not touched.
    plain = onnx.load(str(tiny_llama_merged_dir / "decoder_model_merged.onnx"))
    del plain.graph.input[-1]
    assert not reduce_to_with_past(plain)


def test_a_merged_decoder_fuses_on_load_and_replies_equal_torch(
    tiny_llama_merged_dir: Path, reference: Any, home: Path
) -> None:
    with anyformer.load(str(tiny_llama_merged_dir), backend="onnx") as loaded:
        handle = loaded.handle
        assert isinstance(handle, OnnxChatModel)
        assert handle.details["graph"].startswith(
            "merged decoder reduced to its with-past branch, attention fused into GroupQueryAttention (2 layers"
        )
        assert not handle.loop.graph.has_cache_branch
        _assert_greedy_ids_equal_torch(handle, reference(tiny_llama_merged_dir)["replies"])


def _swap_branches(model: onnx.ModelProto) -> None:
    node = next(n for n in model.graph.node if n.op_type == "If")
    branches = {a.name: a for a in node.attribute}
    then, other = onnx.GraphProto(), onnx.GraphProto()
    then.CopyFrom(branches["then_branch"].g)
    other.CopyFrom(branches["else_branch"].g)
    branches["then_branch"].g.CopyFrom(other)
    branches["else_branch"].g.CopyFrom(then)


def _read_flag_twice(model: onnx.ModelProto) -> None:
    model.graph.node.append(helper.make_node("Not", ["use_cache_branch"], ["flipped"], name="odd"))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_swap_branches, "then branch is not the one reading past_key_values"),
        (_read_flag_twice, "not one If's condition"),
    ],
)
def test_merged_decoders_of_another_layout_are_refused_untouched(
    tiny_llama_merged_dir: Path, change: Any, reason: str
) -> None:
    model = _merged(tiny_llama_merged_dir)
    change(model)
    before = model.SerializeToString()
    with pytest.raises(NotFusable, match=reason):
        reduce_to_with_past(model)
    assert model.SerializeToString() == before


def test_phi3_feeds_its_fused_qkv_projection_to_the_attention_and_replies_equal_torch(
    tiny_phi3_dir: Path, reference: Any, home: Path
) -> None:
    config = _config(tiny_phi3_dir)
    exported = onnx.load(str(tiny_phi3_dir / "onnx" / "model.onnx"))
    fused = onnx.load(str(tiny_phi3_dir / "onnx" / "model.onnx"))
    report = fuse_attention(fused, config)
    assert report.layers == 2 and report.packed_qkv == 2 and report.nodes_after < report.nodes_before / 4
    attention = [n for n in fused.graph.node if n.op_type == "GroupQueryAttention"]
    # The export's own qkv_proj output, whole: GroupQueryAttention splits q, k and v in Phi-3's order.
    assert [list(n.input[:3]) for n in attention] == [
        [f"/model/model/layers.{i}/self_attn/qkv_proj/MatMul_output_0", "", ""] for i in range(2)
    ]
    # The MLP's chunk of gate_up_proj, spelled out with the size read at run time, is one Split.
    assert split_gate_up(fused, config | {"intermediate_size": 64}) == 0  # not the projection's halves
    assert split_gate_up(fused, config) == 2
    kinds = [n.op_type for n in fused.graph.node]
    assert kinds.count("Split") == 2 and "Slice" not in kinds
    onnx.checker.check_model(fused)
    ids = [5, 17, 42, 8, 63, 21, 9, 30]
    for want, got in zip(_logits(exported, config, ids, 6), _logits(fused, config, ids, 6), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))
        assert got.argmax() == want.argmax()
    with anyformer.load(str(tiny_phi3_dir), backend="onnx") as loaded:
        handle = loaded.handle
        assert isinstance(handle, OnnxChatModel)
        assert handle.details["graph"].startswith(
            "attention fused into GroupQueryAttention (2 layers, q/k/v packed in 2"
        )
        _assert_greedy_ids_equal_torch(handle, reference(tiny_phi3_dir)["replies"])


def test_partial_rotary_inside_rope_parameters_is_refused(tiny_phi3_dir: Path) -> None:
    # transformers 5 writes Phi-3's partial_rotary_factor into rope_parameters, not at the top level.
    config = _config(tiny_phi3_dir)
    config["rope_parameters"] = dict(config["rope_parameters"], partial_rotary_factor=0.5)
    with pytest.raises(NotFusable, match="partial rotary"):
        attention_shape(config)


def test_a_sliding_window_fuses_only_when_the_context_fits_in_it(tiny_phi3_dir: Path, home: Path) -> None:
    # Phi-3 and Mistral window their attention whenever sliding_window is set; with no more
    # positions than the window, no key is ever outside it and full attention is the same.
    config = _config(tiny_phi3_dir) | {"sliding_window": 128}
    with pytest.raises(NotFusable, match="sliding-window attention"):
        attention_shape(config)
    graph = tiny_phi3_dir / "onnx" / "model.onnx"
    wide = prepare_decoder(graph, config, repo=None, context=129, progress=_no_progress, label="t")
    assert not wide.fused and "sliding-window attention (window 128, context 129)" in wide.note
    fits = prepare_decoder(graph, config, repo=None, context=128, progress=_no_progress, label="t")
    assert fits.fused, fits.note
    # The fused graph, once made, is still not used for a context past the window.
    assert not prepare_decoder(graph, config, repo=None, context=129, progress=_no_progress, label="t").fused


def test_a_qwen3_config_on_a_graph_without_q_k_norms_is_refused(tiny_llama_dir: Path) -> None:
    # config.json says the heads are normed; a graph that does not norm them is not what it says.
    model = onnx.load(str(tiny_llama_dir / "onnx" / "model.onnx"))
    config = _config(tiny_llama_dir) | {"model_type": "qwen3", "rms_norm_eps": 1e-6}
    with pytest.raises(NotFusable, match="no q_norm and k_norm nodes"):
        fuse_attention(model, config)
