"""Offline (SAFETY D8): the cache serves describe, check and load with no socket opened; a missing file is OFFLINE."""

from __future__ import annotations

import pytest
from huggingface_hub.utils import close_session
from store_helpers import (
    FakeHub,
    StoreBackend,
    block_sockets,
    fake_hub,
    manager_with,
    random_bytes,
    set_hf_offline,
)

import anyformer
from anyformer import Caps
from anyformer.contract._errors import AnyformerError, ErrorCode

__all__ = ["fake_hub"]

WEIGHTS = random_bytes(256 * 1024, seed=11)
OTHER = random_bytes(128 * 1024, seed=12)
FILES = {"model.safetensors": WEIGHTS, "other.safetensors": OTHER, "config.json": b'{"model_type": "llama"}'}
CAPS = Caps(ram_bytes=10**10, store=True)


def test_load_pulls_on_demand_with_download_progress(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("org/m", FILES)
    backend = StoreBackend()
    events: list[anyformer.ProgressEvent] = []
    with anyformer.load("org/m", caps=CAPS, plugins=manager_with(backend), progress=events.append) as loaded:
        assert loaded.backend == "storetest"
    assert backend.loaded_paths["model.safetensors"].read_bytes() == WEIGHTS
    assert {e.file for e in events if e.stage == "download"} == {"model.safetensors", None}
    assert not fake_hub.requests_for("other.safetensors")


@pytest.mark.safety("D8")
def test_offline_a_cached_model_is_described_checked_and_loaded_without_opening_a_socket(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    revision = fake_hub.add_repo("org/m", FILES)
    backend = StoreBackend()
    manager = manager_with(backend)
    anyformer.pull("org/m", caps=CAPS, plugins=manager)
    close_session()
    set_hf_offline(monkeypatch)
    attempts = block_sockets(monkeypatch)
    model = anyformer.describe("org/m")
    assert model.revision == revision and model.file("model.safetensors") is not None
    _, selection = anyformer.check("org/m", caps=CAPS, plugins=manager)
    assert selection.chosen_backend == "storetest"
    with anyformer.load("org/m", caps=CAPS, plugins=manager):
        pass
    assert backend.loaded_paths["model.safetensors"].read_bytes() == WEIGHTS
    assert attempts == []


@pytest.mark.safety("D8")
def test_offline_a_file_missing_from_the_cache_is_offline_naming_the_pull_and_opens_no_socket(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_hub.add_repo("org/m", FILES)
    model = anyformer.describe("org/m")  # online: the full listing
    anyformer.fetch_files(model, ["model.safetensors"])
    close_session()
    set_hf_offline(monkeypatch)
    attempts = block_sockets(monkeypatch)
    with pytest.raises(AnyformerError) as offline:
        anyformer.fetch_files(model, ["other.safetensors"])
    assert offline.value.code is ErrorCode.OFFLINE
    assert "other.safetensors" in offline.value.message and "anyformer pull org/m" in offline.value.message
    with pytest.raises(AnyformerError) as never_pulled:
        anyformer.describe("org/never-pulled")
    assert (
        never_pulled.value.code is ErrorCode.OFFLINE and "anyformer pull org/never-pulled" in never_pulled.value.message
    )
    assert attempts == []


@pytest.mark.safety("D8")
def test_an_unreachable_hub_serves_the_cache_and_says_offline_for_the_rest(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("org/m", FILES)
    backend = StoreBackend()
    manager = manager_with(backend)
    anyformer.pull("org/m", caps=CAPS, plugins=manager)
    online = anyformer.describe("org/m")
    fake_hub.stop()
    with anyformer.load("org/m", caps=CAPS, plugins=manager):
        pass
    assert backend.loaded_paths["model.safetensors"].read_bytes() == WEIGHTS
    with pytest.raises(AnyformerError) as offline:
        anyformer.fetch_files(online, ["other.safetensors"])
    assert offline.value.code is ErrorCode.OFFLINE and "anyformer pull org/m" in offline.value.message
