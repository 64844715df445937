"""Fixtures for the server's tests: servers on loopback over real GGUFs or the in-process paced backend."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer import Caps

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from anyformer.server import ModelPool, create_app

from .server_support import PacedBackend, serve_in_thread

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def model_folders(tmp_path: Path) -> Callable[[str], str]:
    """Make a local model folder (a config.json) by name; returns its path as a model id."""

    def make(name: str) -> str:
        folder = tmp_path / name
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps({"model_type": "paced"}))
        return str(folder)

    return make


@pytest.fixture
def paced_server(tmp_path: Path) -> Callable[..., Any]:
    """Start a server over :class:`PacedBackend`: ``paced_server(**pool_options) -> (url, backend, pool)``.

    Clients may name model folders under ``tmp_path`` (``allow_paths``), as ``model_folders`` makes them;
    ``app`` passes other options to ``create_app``.
    """
    stack = contextlib.ExitStack()

    def start(
        *,
        backend: PacedBackend | None = None,
        api_key: str | None = None,
        caps: Caps | None = None,
        app: dict[str, Any] | None = None,
        **options: Any,
    ) -> tuple[str, PacedBackend, ModelPool]:
        backend = backend or PacedBackend()
        manager = anyformer.PluginManager()
        manager.register(backend, backend.name)
        pool = ModelPool(isolate=False, plugins=manager, caps=caps or Caps(ram_bytes=10**10), **options)
        settings = {"allow_paths": [tmp_path], **(app or {})}
        url = stack.enter_context(serve_in_thread(create_app(pool, api_key=api_key, **settings)))
        return url, backend, pool

    with stack:
        yield start


# ---- real models ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The embedded SmolLM2-135M-Instruct GGUF (skips without the llama.cpp backend)."""
    pytest.importorskip("anyformer_llamacpp")
    return anyformer.default_model_path()


@pytest.fixture(scope="session")
def tiny_gguf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random llama GGUF written by the llama.cpp backend's test helper."""
    pytest.importorskip("anyformer_llamacpp")
    pytest.importorskip("gguf")
    sys.path.insert(0, str(REPO_ROOT / "plugins" / "anyformer-llamacpp" / "tests"))
    try:
        from tiny_gguf import write_tiny_llama
    finally:
        sys.path.pop(0)
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-serve") / "tiny-llama-F32.gguf")


@pytest.fixture(scope="module")
def real_server(smollm2_path: Path, tiny_gguf_path: Path) -> Iterator[tuple[str, ModelPool]]:
    """A server with the installed backends, isolated as ``anyformer.load`` allows, SmolLM2 preloaded."""
    pool = ModelPool(context=2048)
    with serve_in_thread(create_app(pool, preload=[str(smollm2_path)], models=[str(tiny_gguf_path)])) as url:
        yield url, pool
