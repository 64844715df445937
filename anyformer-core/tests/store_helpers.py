"""What the store tests share: the FakeHub fixture, cache inspection, and a backend that loads through the store."""

from __future__ import annotations

import hashlib
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import hub_fixtures
import pytest
from hub_server import FakeHub

from anyformer import Estimate, PluginManager, Rank, Refusal, StoreEntry, Verdict, fetch_files, hookimpl
from anyformer.plugin import BackendModel

fake_hub = hub_fixtures.fake_hub
set_hf_offline = hub_fixtures.set_hf_offline
point_huggingface_hub_at = hub_fixtures.point_huggingface_hub_at
__all__ = ["FakeHub", "fake_hub", "point_huggingface_hub_at", "set_hf_offline"]

MiB = 1024 * 1024


def random_bytes(size: int, seed: int = 0) -> bytes:
    """``size`` reproducible pseudo-random bytes (incompressible, unlike zeros)."""
    out = bytearray()
    block = hashlib.sha256(f"seed {seed}".encode()).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:size])


def sha256(data: bytes) -> str:
    """The hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def hub_cache() -> pathlib.Path:
    """huggingface_hub's cache folder for this test."""
    from huggingface_hub import constants

    return pathlib.Path(constants.HF_HUB_CACHE)


def repo_root(repo_id: str) -> pathlib.Path:
    """The cache folder of ``repo_id``."""
    return hub_cache() / ("models--" + repo_id.replace("/", "--"))


def blob_names(repo_id: str) -> list[str]:
    """Every file in the repo's ``blobs/`` folder, partial downloads included."""
    blobs = repo_root(repo_id) / "blobs"
    return sorted(p.name for p in blobs.iterdir()) if blobs.is_dir() else []


def snapshot_names(repo_id: str) -> list[str]:
    """Every file linked from any snapshot of the repo."""
    snapshots = repo_root(repo_id) / "snapshots"
    if not snapshots.is_dir():
        return []
    return sorted(str(p.relative_to(snapshots).as_posix()) for p in snapshots.rglob("*") if not p.is_dir())


def assert_nothing_stored(repo_id: str, name: str, data: bytes, *, partial_allowed: bool = False) -> None:
    """No blob of ``data`` under its final name and no snapshot link for ``name``; no partial file unless allowed."""
    __tracebackhide__ = True
    digest = sha256(data)
    blobs = blob_names(repo_id)
    assert digest not in blobs, f"the blob {digest} was stored: {blobs}"
    assert not any(n.endswith("/" + name) for n in snapshot_names(repo_id)), snapshot_names(repo_id)
    if not partial_allowed:
        assert not any(n.endswith(".incomplete") for n in blobs), f"a partial file was left: {blobs}"


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries without waiting (the count of retries stays what it is)."""
    from anyformer.store import _download

    monkeypatch.setattr(_download, "BACKOFF_SECONDS", (0.0,) * len(_download.BACKOFF_SECONDS))


def block_sockets(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Make every attempt to open a network connection fail loudly; return the list of attempts."""
    import socket

    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise AssertionError(f"a socket was opened while offline: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts


class StoreBackend:
    """A backend that runs repos holding ``fmt`` files and loads by fetching the files its verdict names.

    ``files=None`` names no files (the store's fallback applies); ``stored`` are its ``store_list`` entries.
    """

    def __init__(
        self, name: str = "storetest", fmt: str = "safetensors", files: tuple[str, ...] | None = ("model.safetensors",)
    ) -> None:
        self.name = name
        self.fmt = fmt
        self.files = files
        self.stored: list[StoreEntry] = []
        self.loaded_paths: dict[str, pathlib.Path] = {}

    @hookimpl
    def can_run(self, model: Any, caps: Any, request: Any) -> Verdict:
        if self.fmt not in model.formats:
            return Verdict.refuse(self.name, Refusal.FORMAT, f"no {self.fmt} in the repo")
        names = tuple(n for n in (self.files or ()) if model.file(n) is not None)
        return Verdict.accept(self.name, Estimate(ram_bytes=1, rank=Rank.SPECIALIST, files=names))

    @hookimpl
    def load(self, model: Any, request: Any, progress: Any) -> Any:
        self.loaded_paths = fetch_files(model, list(self.files or ()), progress, backend=self.name)
        return _Handle(self.name)

    @hookimpl
    def store_list(self) -> list[StoreEntry]:
        return list(self.stored)


class _Handle(BackendModel):
    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.task = "text-generation"

    def dispose(self) -> None:
        pass


def manager_with(*backends: StoreBackend) -> PluginManager:
    """A plugin manager holding only these backends."""
    manager = PluginManager()
    for backend in backends:
        manager.register(backend, backend.name)
    return manager


def hf_env(hub: FakeHub, home: pathlib.Path) -> dict[str, str]:
    """The environment that points a child process's huggingface_hub at ``hub`` with its cache under ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(
        {
            "HF_ENDPOINT": hub.url,
            "HF_HOME": str(home),
            "HF_HUB_CACHE": str(home / "hub"),
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1",
        }
    )
    return env


def iter_files(folder: pathlib.Path) -> Iterator[pathlib.Path]:
    """Every file under ``folder`` (links not followed)."""
    for root, _dirs, names in os.walk(folder):
        for name in names:
            yield pathlib.Path(root) / name


def make_gguf(path: pathlib.Path, tensor_bytes: int = 256 * 1024) -> bytes:
    """A valid little llama GGUF (header facts and one tensor) that the llama.cpp backend's can_run accepts."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_tensor("token_embd.weight", np.zeros((tensor_bytes // 32, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()
