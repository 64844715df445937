"""Fixtures: tiny random safetensors models, built once per test session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import BUILDERS


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each architecture's tiny model folder, by name (``llama``, ``qwen3``)."""
    root = tmp_path_factory.mktemp("tiny-transformers")
    return {name: build(root / name) for name, build in BUILDERS.items()}


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_dir: dict[str, Path]) -> Path:
    """The tiny llama's folder."""
    return tiny_model_dir["llama"]


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each tiny BERT's folder, by name (``embedder``, ``text-classifier``, ``token-classifier``)."""
    from tiny_encoders import ENCODER_BUILDERS

    root = tmp_path_factory.mktemp("tiny-encoders")
    return {name: build(root / name) for name, build in ENCODER_BUILDERS.items()}


@pytest.fixture(scope="session")
def tiny_media_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each tiny vision or speech model's folder, by its task (``image-classification``…)."""
    from tiny_media import MEDIA_BUILDERS

    root = tmp_path_factory.mktemp("tiny-media")
    return {task: build(root / task) for task, build in MEDIA_BUILDERS.items()}
