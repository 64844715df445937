"""The anyformer conformance kit against the LocalMind backend, on lavapipe (ANYFORMER_SOFTWARE_GPU=1).

The sample is a tiny random llama GGUF (two layers, a 269-token byte-level vocabulary, a ChatML
template) so the stream tests stay fast on a CPU Vulkan driver; the real SmolLM2 is checked in
test_generate.py.
"""

from __future__ import annotations

import pytest
from descriptions import gguf_model

import anyformer
from anyformer import Model, Refusal
from anyformer_conformance import BackendConformance, RefusalCase
from anyformer_gguf_gpu.testing import RandomModel, write_random_gguf

pytest_plugins = ["anyformer_conformance.plugin"]


class TestLocalMindConformance(BackendConformance):
    """LocalMind: text generation from llama/qwen3 GGUFs on a GPU adapter; nothing kept in a store."""

    backend_id = "localmind"
    supports_images = False
    supports_store = True
    max_new_tokens_for_tests = 8

    refusal_cases = (
        RefusalCase({"repo": "org/onnx", "files": [{"name": "model.onnx", "size": 4096}]}, {}, {}, Refusal.FORMAT),
        RefusalCase(gguf_model(), {}, {"task": "feature-extraction"}, Refusal.TASK),
        RefusalCase(gguf_model(architecture="gemma3"), {}, {}, Refusal.MODEL),
        RefusalCase(gguf_model(tensor_types={"F32": 61, "Q2_K": 211}), {}, {}, Refusal.MODEL),
        RefusalCase(gguf_model(), {"gpu": False}, {}, Refusal.GPU),
        RefusalCase(gguf_model(), {}, {"budget": 50_000_000}, Refusal.BUDGET),
    )

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tmp_path_factory: pytest.TempPathFactory) -> Model:
        """A tiny random llama GGUF, described like any local file."""
        path = tmp_path_factory.mktemp("localmind-sample") / "tiny-llama.gguf"
        write_random_gguf(str(path), RandomModel())
        return anyformer.describe(path)
