"""``anyformer.pull``: the chosen backend's files plus metadata files, or the fallback when a verdict names none."""

from __future__ import annotations

import pathlib

import pytest
from hostile_files import make_safetensors
from store_helpers import FakeHub, StoreBackend, fake_hub, manager_with, random_bytes, snapshot_names

import anyformer
from anyformer import Caps, Estimate
from anyformer.contract._errors import AnyformerError, ErrorCode

__all__ = ["fake_hub"]

CAPS = Caps(ram_bytes=10**10, store=True)
FILES = {
    "model.safetensors": random_bytes(64 * 1024, seed=21),
    "model-fp16.safetensors": random_bytes(96 * 1024, seed=22),
    "pytorch_model.bin": b"pickle bytes never wanted",
    "config.json": b'{"model_type": "llama"}',
    "generation_config.json": b"{}",
    "tokenizer.json": b"{}",
    "tokenizer_config.json": b"{}",
    "chat_template.jinja": b"{{ messages }}",
    "README.md": b"# a model",
    "sub/config.json": b"{}",
}


def _pulled(revision: str) -> list[str]:
    return sorted(n.removeprefix(revision + "/") for n in snapshot_names("org/m"))


def test_pull_fetches_the_files_the_verdict_names_and_the_metadata_files(fake_hub: FakeHub) -> None:
    revision = fake_hub.add_repo("org/m", FILES)
    result = anyformer.pull("org/m", caps=CAPS, plugins=manager_with(StoreBackend()))
    wanted = [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert sorted(result.paths) == wanted and _pulled(revision) == wanted
    assert result.backend == "storetest" and result.model.revision == revision
    assert "config.json" not in result.downloaded  # describe had fetched it already
    assert result.downloaded_bytes == result.bytes - len(FILES["config.json"])
    for name in ("model-fp16.safetensors", "pytorch_model.bin", "README.md"):
        assert not fake_hub.requests_for(name), f"{name} was fetched"
    again = anyformer.pull("org/m", caps=CAPS, plugins=manager_with(StoreBackend()))
    assert again.downloaded == () and again.downloaded_bytes == 0
    assert again.to_dict()["files"][0]["downloaded"] is False


def test_a_verdict_naming_no_files_pulls_every_file_but_pickle_weights(fake_hub: FakeHub) -> None:
    revision = fake_hub.add_repo("org/m", FILES)
    anyformer.pull("org/m", caps=CAPS, plugins=manager_with(StoreBackend(files=None)))
    assert _pulled(revision) == sorted(set(FILES) - {"pytorch_model.bin"})


def test_pull_refuses_when_no_backend_can_run_the_model_and_fetches_nothing(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("org/m", FILES)
    with pytest.raises(AnyformerError) as refused:
        anyformer.pull("org/m", caps=CAPS, plugins=manager_with(StoreBackend(fmt="gguf")))
    assert refused.value.code is ErrorCode.NO_BACKEND
    assert not [r for r in fake_hub.requests if r[0] == "GET" and "/resolve/" in r[1] and "config.json" not in r[1]]


def test_pull_for_a_named_backend_uses_that_backends_files(fake_hub: FakeHub) -> None:
    revision = fake_hub.add_repo("org/m", FILES)
    first = StoreBackend("first", files=("model.safetensors",))
    second = StoreBackend("second", files=("model-fp16.safetensors",))
    result = anyformer.pull("org/m", backend="second", caps=CAPS, plugins=manager_with(first, second))
    assert result.backend == "second"
    assert "model-fp16.safetensors" in _pulled(revision) and "model.safetensors" not in _pulled(revision)


def test_a_local_model_is_not_pulled(tmp_path: pathlib.Path) -> None:
    (tmp_path / "config.json").write_bytes(b"{}")
    (tmp_path / "model.safetensors").write_bytes(make_safetensors({}))
    with pytest.raises(AnyformerError) as refused:
        anyformer.pull(tmp_path, caps=CAPS, plugins=manager_with(StoreBackend()))
    assert refused.value.code is ErrorCode.BAD_REQUEST


def test_estimate_files_is_in_the_verdict_json_only_when_named() -> None:
    assert "files" not in Estimate().to_dict()
    assert Estimate(files=("a.gguf", "b.gguf")).to_dict()["files"] == ["a.gguf", "b.gguf"]
