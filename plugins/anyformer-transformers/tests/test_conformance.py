"""The anyformer conformance kit against the transformers backend, exactly as a third party runs it.

The samples: a tiny random llama saved as safetensors with a character tokenizer (tiny_models.py),
tiny random BERTs (a sentence-transformers embedder, a text classifier) whose ``run`` the kit's
progress and cancel tests drive (tiny_encoders.py), and from tiny_media.py a ViT classifier and a
Whisper (``run`` on images and clips) and a LLaVA (chat with image blocks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer import Model, Refusal
from anyformer_conformance import BackendConformance, RefusalCase

pytest_plugins = ["anyformer_conformance.plugin"]

_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
_FILES = [
    {"name": "config.json", "size": 600},
    {"name": "tokenizer.json", "size": 4000},
    {"name": "model.safetensors", "size": 4 * 10**9},
]


class _TransformersKit(BackendConformance):
    backend_id = "transformers"
    supports_images = False
    supports_store = False
    max_new_tokens_for_tests = 8

    refusal_cases = (
        RefusalCase({"repo": "org/g", "files": [{"name": "m-Q4_0.gguf", "size": 10**6}]}, {}, {}, Refusal.FORMAT),
        RefusalCase({"repo": "org/s", "files": _FILES, "config": _CONFIG}, {}, {"task": "summarization"}, Refusal.TASK),
        RefusalCase(
            {"repo": "org/s", "files": _FILES, "config": {**_CONFIG, "auto_map": {"AutoModel": "m.M"}}},
            {},
            {},
            Refusal.MODEL,
        ),
        RefusalCase({"repo": "org/s", "files": _FILES, "config": _CONFIG}, {"ram_bytes": 10**9}, {}, Refusal.MEMORY),
    )


class TestTinyLlamaConformance(_TransformersKit):
    """A tiny llama from safetensors on the CPU."""

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tiny_llama_dir: Path) -> Model:
        return anyformer.describe(tiny_llama_dir)


class TestTinyBertEmbeddingConformance(_TransformersKit):
    """A tiny BERT for feature-extraction: no generate; its ``run`` on 40 texts (two batches) reports and cancels."""

    supports_generate = False

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tiny_encoder_dir: dict[str, Path]) -> Model:
        return anyformer.describe(tiny_encoder_dir["embedder"])

    @pytest.fixture(scope="class")
    @classmethod
    def run_sample(cls) -> tuple[Any, dict[str, Any]]:
        return [f"the cat sat on the mat {i}" for i in range(40)], {}


class TestTinyBertClassifierConformance(_TransformersKit):
    """A tiny BERT for text-classification: no generate; its ``run`` on 40 texts (two batches) reports and cancels."""

    supports_generate = False

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tiny_encoder_dir: dict[str, Path]) -> Model:
        return anyformer.describe(tiny_encoder_dir["text-classifier"])

    @pytest.fixture(scope="class")
    @classmethod
    def run_sample(cls) -> tuple[Any, dict[str, Any]]:
        return [f"I love this movie {i}" for i in range(40)], {"top_k": None}


class TestTinyViTConformance(_TransformersKit):
    """A tiny ViT for image-classification: no generate; its ``run`` on 3 images reports each and cancels."""

    supports_generate = False

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tiny_media_dir: dict[str, Path]) -> Model:
        return anyformer.describe(tiny_media_dir["image-classification"])

    @pytest.fixture(scope="class")
    @classmethod
    def run_sample(cls) -> tuple[Any, dict[str, Any]]:
        from tiny_media import picture

        return [picture(20 + 5 * i, 30, seed=i) for i in range(3)], {"top_k": 2}


class TestTinyWhisperConformance(_TransformersKit):
    """A tiny Whisper for speech recognition: no generate; its ``run`` on 2 clips reports each and cancels."""

    supports_generate = False

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tiny_media_dir: dict[str, Path]) -> Model:
        return anyformer.describe(tiny_media_dir["automatic-speech-recognition"])

    @pytest.fixture(scope="class")
    @classmethod
    def run_sample(cls) -> tuple[Any, dict[str, Any]]:
        from tiny_media import tone

        return [tone(1.0, 200.0, seed=0), tone(1.0, 300.0, seed=1)], {"max_new_tokens": 4}


class TestTinyLlavaConformance(_TransformersKit):
    """A tiny LLaVA: chat with and without image blocks."""

    supports_images = True

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tiny_media_dir: dict[str, Path]) -> Model:
        return anyformer.describe(tiny_media_dir["image-text-to-text"])
