"""describe_hub against a FakeHub through the real huggingface_hub client (no mocks)."""

from __future__ import annotations

import hashlib
import pathlib

import gguf
import hub_fixtures
import huggingface_hub
import numpy as np
import pytest
from hub_server import FakeHub

import anyformer
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.store._hub import HubByteSource, describe_hub

fake_hub = hub_fixtures.fake_hub
MiB = 1024 * 1024
CONFIG = b'{"model_type": "qwen2", "hidden_size": 8}'
WEIGHTS = b"\x01" * 4096


def make_gguf(path: pathlib.Path, arch: str, tensor_bytes: int = 4 * MiB) -> bytes:
    """A valid GGUF of ``arch`` whose tensor data makes it ``tensor_bytes`` long (give or take the header)."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((tensor_bytes // 32, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@pytest.fixture
def gguf_bytes(tmp_path: pathlib.Path) -> bytes:
    return make_gguf(tmp_path / "m.gguf", "llama")


def test_sizes_sha256_task_tags_and_architecture_from_config(fake_hub: FakeHub) -> None:
    sha = fake_hub.add_repo(
        "org/cfg",
        {"config.json": CONFIG, "model.safetensors": WEIGHTS},
        pipeline_tag="text-generation",
        tags=["qwen2", "safetensors"],
    )
    model = describe_hub("org/cfg", None)
    assert (model.repo, model.revision, model.source) == ("org/cfg", sha, "hub")
    assert model.architecture == "qwen2"
    assert model.task == "text-generation" and model.tags == ("qwen2", "safetensors")
    weights = model.file("model.safetensors")
    assert weights is not None and weights.size == len(WEIGHTS)
    assert weights.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    assert model.file("config.json").size == len(CONFIG)
    assert model.config["hidden_size"] == 8
    assert model.formats == ("safetensors",)
    assert not fake_hub.requests_for("model.safetensors")  # weights are never touched


def test_architecture_from_a_gguf_header_read_by_range_requests(fake_hub: FakeHub, gguf_bytes: bytes) -> None:
    fake_hub.add_repo("org/gguf", {"model-Q4_0.gguf": gguf_bytes}, tags=["gguf"])
    model = describe_hub("org/gguf", "main")
    assert model.architecture == "llama"
    assert model.metadata["gguf_file"] == "model-Q4_0.gguf"
    assert model.metadata["gguf"]["block_count"] == 2
    gets = fake_hub.requests_for("model-Q4_0.gguf")
    assert gets and all(method == "GET" and "range" in headers for method, _, headers in gets)
    assert gets[0][2]["range"] == f"bytes=0-{MiB - 1}"
    assert len(gets) * MiB < len(gguf_bytes), "the whole GGUF was downloaded to read its header"
    assert not (pathlib.Path(huggingface_hub.constants.HF_HUB_CACHE) / "models--org--gguf").exists()


def test_mmproj_files_are_skipped(fake_hub: FakeHub, tmp_path: pathlib.Path, gguf_bytes: bytes) -> None:
    projector = make_gguf(tmp_path / "mmproj.gguf", "clip", tensor_bytes=4096)
    fake_hub.add_repo("org/vlm", {"mmproj-model-f16.gguf": projector, "model-Q8_0.gguf": gguf_bytes})
    model = describe_hub("org/vlm", None)
    assert model.architecture == "llama" and model.metadata["gguf_file"] == "model-Q8_0.gguf"
    assert not fake_hub.requests_for("mmproj-model-f16.gguf")


def test_the_hubs_gguf_facts_are_kept_and_the_header_still_read_by_range(fake_hub: FakeHub, gguf_bytes: bytes) -> None:
    # The header's layer and head counts size backends' KV-cache estimates, so it is read even when
    # the Hub names the architecture; only by range requests, never the whole file.
    fake_hub.add_repo("org/known", {"m.gguf": gguf_bytes}, gguf={"architecture": "gemma3", "total": 1000})
    model = describe_hub("org/known", None)
    assert model.architecture == "gemma3"
    assert model.metadata["hub_gguf"] == {"architecture": "gemma3", "total": 1000}
    assert model.metadata["gguf_file"] == "m.gguf" and "block_count" in model.metadata["gguf"]
    gets = fake_hub.requests_for("m.gguf", method="GET")
    assert gets and all(headers.get("range") for _, _, headers in gets)


def test_a_hostile_gguf_header_is_bad_model(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("org/evil", {"m.gguf": b"GGUF" + b"\xff" * 60})
    with pytest.raises(AnyformerError) as info:
        describe_hub("org/evil", None)
    assert info.value.code is ErrorCode.BAD_MODEL


def test_a_missing_repo_is_model_not_found_naming_it(fake_hub: FakeHub) -> None:
    with pytest.raises(AnyformerError) as info:
        describe_hub("org/missing", "v1")
    assert info.value.code is ErrorCode.MODEL_NOT_FOUND and "org/missing" in info.value.message
    assert isinstance(info.value.__cause__, huggingface_hub.errors.RepositoryNotFoundError)


def test_a_missing_revision_is_model_not_found_naming_it(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("org/cfg", {"config.json": CONFIG})
    with pytest.raises(AnyformerError) as info:
        describe_hub("org/cfg", "v9")
    assert info.value.code is ErrorCode.MODEL_NOT_FOUND and "v9" in info.value.message


@pytest.mark.parametrize("fault", ["garbage", "error_status"])
def test_junk_or_a_server_error_is_download_failed(fake_hub: FakeHub, fault: str) -> None:
    fake_hub.add_repo("org/cfg", {"config.json": CONFIG})
    setattr(fake_hub, fault, True if fault == "garbage" else 500)
    with pytest.raises(AnyformerError) as info:
        describe_hub("org/cfg", None)
    assert info.value.code is ErrorCode.DOWNLOAD_FAILED
    assert info.value.__cause__ is not None


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/../../b", "a\\b"])
def test_an_unsafe_name_in_the_listing_is_bad_model(fake_hub: FakeHub, name: str) -> None:
    fake_hub.add_repo("org/evil", {"config.json": CONFIG, name: b"x"})
    with pytest.raises(AnyformerError) as info:
        describe_hub("org/evil", None)
    assert info.value.code is ErrorCode.BAD_MODEL


@pytest.mark.parametrize("repo", ["a/b/c", "../x", "-x", "org/a--b", "", "org/na me", "org/x.."])
def test_a_malformed_repo_id_is_bad_request(repo: str) -> None:
    with pytest.raises(AnyformerError) as info:
        describe_hub(repo, None)
    assert info.value.code is ErrorCode.BAD_REQUEST


def test_offline_with_nothing_cached_is_offline_and_says_what_to_pull(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_hub.add_repo("org/cfg", {"config.json": CONFIG})
    hub_fixtures.set_hf_offline(monkeypatch)
    with pytest.raises(AnyformerError) as info:
        describe_hub("org/cfg", None)
    assert info.value.code is ErrorCode.OFFLINE and "anyformer pull org/cfg" in info.value.message
    assert not fake_hub.requests


def test_offline_with_a_cached_snapshot_describes_it_from_the_cache(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch, gguf_bytes: bytes
) -> None:
    sha = fake_hub.add_repo("org/cached", {"model.gguf": gguf_bytes, "README.md": b"# hi", "big.safetensors": WEIGHTS})
    huggingface_hub.hf_hub_download("org/cached", "model.gguf")
    huggingface_hub.hf_hub_download("org/cached", "README.md")
    hub_fixtures.set_hf_offline(monkeypatch)
    fake_hub.requests.clear()
    model = describe_hub("org/cached", None)
    assert (model.revision, model.source, model.architecture) == (sha, "hub", "llama")
    assert {f.name: f.size for f in model.files} == {"model.gguf": len(gguf_bytes), "README.md": 4}
    assert model.file("model.gguf").sha256 == hashlib.sha256(gguf_bytes).hexdigest()
    assert model.metadata["gguf_file"] == "model.gguf"
    assert not fake_hub.requests


def test_an_unreachable_hub_is_offline_unless_the_repo_is_cached(fake_hub: FakeHub) -> None:
    sha = fake_hub.add_repo("org/cfg", {"config.json": CONFIG})
    huggingface_hub.hf_hub_download("org/cfg", "config.json")
    fake_hub.stop()
    model = describe_hub("org/cfg", None)
    assert (model.revision, model.architecture) == (sha, "qwen2")
    with pytest.raises(AnyformerError) as info:
        describe_hub("org/other", None)
    assert info.value.code is ErrorCode.OFFLINE and "anyformer pull org/other" in info.value.message


def test_describe_routes_a_repo_id_with_revision_to_the_hub(fake_hub: FakeHub) -> None:
    sha = fake_hub.add_repo("org/cfg", {"config.json": CONFIG}, revision="v1")
    model = anyformer.describe("org/cfg@v1")
    assert (model.revision, model.architecture) == (sha, "qwen2")
    assert describe_hub("org/cfg", sha).revision == sha  # the commit sha resolves too


def test_hub_byte_source_reads_across_blocks_and_fetches_each_once(fake_hub: FakeHub) -> None:
    data = bytes(range(256)) * (3 * MiB // 256)
    fake_hub.add_repo("org/blob", {"w.bin": data})
    source = HubByteSource("org/blob", "w.bin", "main")  # size from a HEAD request
    assert source.size == len(data)
    assert source.read_at(MiB - 10, 20) == data[MiB - 10 : MiB + 10]
    assert source.read_at(MiB + 5, 100) == data[MiB + 5 : MiB + 105]
    assert source.read_at(len(data) - 4, 100) == data[-4:]
    assert source.read_at(len(data), 10) == b""
    ranges = [h["range"] for m, _, h in fake_hub.requests_for("w.bin", "GET")]
    assert ranges == [f"bytes=0-{MiB - 1}", f"bytes={MiB}-{2 * MiB - 1}", f"bytes={2 * MiB}-{3 * MiB - 1}"]


def test_hub_byte_source_copes_with_a_server_that_ignores_range(fake_hub: FakeHub) -> None:
    data = bytes(range(256)) * (3 * MiB // 256)
    fake_hub.add_repo("org/blob", {"w.bin": data})
    fake_hub.ignore_range = True
    source = HubByteSource("org/blob", "w.bin", size=len(data))
    assert source.read_at(MiB + 1, 10) == data[MiB + 1 : MiB + 11]
    assert source.read_at(0, 10) == data[:10]  # block 0 came with the first answer
    assert source.requests == 1 and source.bytes_fetched == 2 * MiB


def test_hub_byte_source_refuses_to_read_past_its_limit(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("org/blob", {"w.bin": b"\x00" * (3 * MiB)})
    source = HubByteSource("org/blob", "w.bin", size=3 * MiB, max_bytes=2 * MiB)
    source.read_at(0, 2 * MiB)
    with pytest.raises(AnyformerError) as info:
        source.read_at(2 * MiB, 1)
    assert info.value.code is ErrorCode.BAD_MODEL


def test_hub_byte_source_maps_a_short_body_to_download_failed(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("org/blob", {"w.bin": b"\x00" * 1000})
    fake_hub.short_body["w.bin"] = 10
    with pytest.raises(AnyformerError) as info:
        HubByteSource("org/blob", "w.bin", size=1000).read_at(0, 1000)
    assert info.value.code is ErrorCode.DOWNLOAD_FAILED
