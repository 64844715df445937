"""The anyformer conformance kit against kohra, run as any third-party plugin runs it (from its entry point)."""

from __future__ import annotations

import pytest
from kohra_fixtures import fixture_repo

import anyformer
from anyformer import Model, Refusal
from anyformer_conformance import BackendConformance, RefusalCase

pytest_plugins = ["anyformer_conformance.plugin"]

_GRAPH = {"name": "onnx/model.onnx", "size": 40_000_000}
_FP16 = {"name": "onnx/model_fp16_fused.onnx", "size": 20_000_000}
_DIFFUSION = ["text-diffusion"]


class TestKohraConformance(BackendConformance):
    """kohra on the tiny MDLM: text only, nothing stored besides the Hub cache."""

    backend_id = "kohra"
    supports_images = False
    supports_store = True
    max_new_tokens_for_tests = 8

    refusal_cases = (
        RefusalCase({"repo": "org/plain-lm", "files": [_GRAPH]}, {}, {}, Refusal.MODEL),
        RefusalCase(
            {"repo": "org/dlm", "tags": _DIFFUSION, "files": [_GRAPH]}, {}, {"task": "fill-mask"}, Refusal.TASK
        ),
        RefusalCase(
            {"repo": "org/dlm", "tags": _DIFFUSION, "files": [{"name": "model.gguf", "size": 9}]},
            {},
            {},
            Refusal.FORMAT,
        ),
        # The fp16 graph alone, on a machine whose provider is the CPU: nothing kohra would load.
        RefusalCase({"repo": "org/dlm", "tags": _DIFFUSION, "files": [_FP16]}, {"gpu": False}, {}, Refusal.FORMAT),
        RefusalCase(
            {"repo": "org/dlm", "tags": _DIFFUSION, "source": "hub", "files": [_GRAPH]},
            {"store": False},
            {},
            Refusal.STORE,
        ),
        RefusalCase(
            {"repo": "org/dlm", "tags": _DIFFUSION, "files": [_GRAPH]}, {"ram_bytes": 50_000_000}, {}, Refusal.MEMORY
        ),
    )

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls) -> Model:
        """The tiny random MDLM, described from its folder (tags from its README's front matter)."""
        return anyformer.describe(fixture_repo("mdlm"))


class TestKohraBlockDiffusionConformance(BackendConformance):
    """kohra on the tiny BD3LM (tag ``block-diffusion``): a chunk per finished block."""

    backend_id = "kohra"
    supports_images = False
    supports_store = True
    max_new_tokens_for_tests = 8

    refusal_cases = (
        RefusalCase({"repo": "org/bd3lm", "tags": ["block-diffusion"], "files": [_GRAPH]}, {}, {}, Refusal.MODEL),
        RefusalCase(
            {"repo": "org/bd3lm", "tags": [*_DIFFUSION, "block-diffusion"], "files": [_GRAPH]},
            {},
            {"task": "text-classification"},
            Refusal.TASK,
        ),
    )

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls) -> Model:
        """The tiny random BD3LM with its key/value cache."""
        return anyformer.describe(fixture_repo("bd3lm"))


class TestKohraRecomputedBlockConformance(BackendConformance):
    """kohra on the tiny BD3LM exported without a cache: block-causal attention from a 4-D mask."""

    backend_id = "kohra"
    supports_images = False
    supports_store = True
    max_new_tokens_for_tests = 8

    refusal_cases = (
        RefusalCase(
            {"repo": "org/bd3lm", "tags": [*_DIFFUSION, "block-diffusion"], "files": [{"name": "model.safetensors"}]},
            {},
            {},
            Refusal.FORMAT,
        ),
    )

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls) -> Model:
        """The tiny random BD3LM whose graph takes an attention mask instead of past_key_values."""
        return anyformer.describe(fixture_repo("bd3lm-mask"))
