"""The anyformer conformance kit against the diskformer backend, on the CPU.

The sample is a tiny random qwen3moe GGUF (two layers, eight experts, top-2, a 269-token
byte-level vocabulary, a ChatML template) so the stream tests stay fast.
"""

from __future__ import annotations

import pytest
from descriptions import moe_model

import anyformer
from anyformer import Model, Refusal
from anyformer_conformance import BackendConformance, RefusalCase
from anyformer_diskformer.testing import TinyMoE, write_tiny_moe

pytest_plugins = ["anyformer_conformance.plugin"]


class TestDiskformerConformance(BackendConformance):
    """diskformer: text generation from qwen3moe GGUFs, experts streamed from disk; nothing kept in a store."""

    backend_id = "diskformer"
    supports_images = False
    supports_store = True
    max_new_tokens_for_tests = 8
    # A smaller offer shrinks the expert cache (experts are read from disk): it still runs, with less.
    fits_smaller_offers = True

    refusal_cases = (
        RefusalCase({"repo": "org/onnx", "files": [{"name": "model.onnx", "size": 4096}]}, {}, {}, Refusal.FORMAT),
        RefusalCase(moe_model(), {}, {"task": "feature-extraction"}, Refusal.TASK),
        RefusalCase(moe_model(architecture="llama", expert_count=None), {}, {}, Refusal.MODEL),
        RefusalCase(moe_model(tensor_types={"F32": 61, "Q2_K": 211}), {}, {}, Refusal.MODEL),
        RefusalCase(moe_model(), {"ram_bytes": 50_000_000}, {}, Refusal.MEMORY),
    )

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tmp_path_factory: pytest.TempPathFactory) -> Model:
        """A tiny random qwen3moe GGUF, described like any local file."""
        path = tmp_path_factory.mktemp("diskformer-sample") / "tiny-qwen3moe.gguf"
        write_tiny_moe(str(path), TinyMoE(quant="Q8_0"))
        return anyformer.describe(path)
