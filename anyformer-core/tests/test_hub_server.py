"""FakeHub answers the real huggingface_hub client as the Hub would (no mocks)."""

from __future__ import annotations

import hashlib
import pathlib

import huggingface_hub
import pytest
from hub_fixtures import fake_hub
from hub_server import FakeHub, StandIn, git_blob_sha1
from huggingface_hub import HfApi, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

__all__ = ["fake_hub"]  # the fixture, for these tests

WEIGHTS = bytes(range(256)) * 40  # 10240 bytes, LFS by suffix
CONFIG = b'{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}'


@pytest.fixture
def repo(fake_hub: FakeHub) -> str:
    """A small repo: one LFS weight file, a config and a file in a folder."""
    return fake_hub.add_repo(
        "org/tiny",
        {"model.safetensors": WEIGHTS, "config.json": CONFIG, "sub/notes.txt": b"hello"},
        pipeline_tag="text-generation",
        tags=["llama", "safetensors"],
    )


def test_model_info_with_files_metadata_gives_sizes_and_lfs_sha256(fake_hub: FakeHub, repo: str) -> None:
    info = HfApi().model_info("org/tiny", files_metadata=True)
    assert info.id == "org/tiny"
    assert info.sha == repo and len(repo) == 40
    assert info.pipeline_tag == "text-generation"
    assert info.tags == ["llama", "safetensors"]
    siblings = {s.rfilename: s for s in info.siblings}
    assert siblings["model.safetensors"].size == len(WEIGHTS)
    assert siblings["model.safetensors"].lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    assert siblings["config.json"].lfs is None
    assert siblings["config.json"].blob_id == git_blob_sha1(CONFIG)
    assert info.config == {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}


def test_module_level_model_info_and_commit_revision_reach_the_fake(fake_hub: FakeHub, repo: str) -> None:
    info = huggingface_hub.model_info("org/tiny", revision=repo)
    assert info.sha == repo
    assert fake_hub.requests[-1][1].startswith(f"/api/models/org/tiny/revision/{repo}")


def test_list_repo_files_and_tree(fake_hub: FakeHub, repo: str) -> None:
    api = HfApi()
    assert sorted(api.list_repo_files("org/tiny")) == ["config.json", "model.safetensors", "sub/notes.txt"]
    top = {e.path for e in api.list_repo_tree("org/tiny")}
    assert top == {"config.json", "model.safetensors", "sub"}


def test_hf_hub_download_fetches_the_bytes_into_the_cache(fake_hub: FakeHub, repo: str) -> None:
    path = pathlib.Path(hf_hub_download("org/tiny", "model.safetensors"))
    assert path.read_bytes() == WEIGHTS
    cache = pathlib.Path(huggingface_hub.constants.HF_HUB_CACHE)
    assert path.is_relative_to(cache / "models--org--tiny" / "snapshots" / repo)
    assert (cache / "models--org--tiny" / "blobs" / hashlib.sha256(WEIGHTS).hexdigest()).exists()
    assert (cache / "models--org--tiny" / "refs" / "main").read_text() == repo
    methods = [r[0] for r in fake_hub.requests_for("model.safetensors")]
    assert methods == ["HEAD", "GET"]


def test_snapshot_download_gets_every_file(fake_hub: FakeHub, repo: str) -> None:
    folder = pathlib.Path(snapshot_download("org/tiny"))
    assert (folder / "sub" / "notes.txt").read_bytes() == b"hello"
    assert (folder / "config.json").read_bytes() == CONFIG


def test_range_request_answers_206_with_content_range(fake_hub: FakeHub, repo: str) -> None:
    url = hf_hub_url("org/tiny", "model.safetensors")
    response = get_session().get(url, headers={**build_hf_headers(), "Range": "bytes=100-199"})
    hf_raise_for_status(response)
    assert response.status_code == 206
    assert response.headers["Content-Range"] == f"bytes 100-199/{len(WEIGHTS)}"
    assert response.content == WEIGHTS[100:200]
    assert fake_hub.requests_for("model.safetensors")[-1][2]["range"] == "bytes=100-199"


def test_head_carries_the_hub_headers_and_no_xet(fake_hub: FakeHub, repo: str) -> None:
    response = get_session().head(hf_hub_url("org/tiny", "model.safetensors"), headers=build_hf_headers())
    sha = hashlib.sha256(WEIGHTS).hexdigest()
    assert response.headers["X-Repo-Commit"] == repo
    assert response.headers["X-Linked-Etag"] == f'"{sha}"'
    assert response.headers["X-Linked-Size"] == str(len(WEIGHTS))
    assert response.headers["Accept-Ranges"] == "bytes"
    assert not [h for h in response.headers if h.lower().startswith("x-xet")]


def test_unknown_repo_maps_to_repository_not_found(fake_hub: FakeHub) -> None:
    with pytest.raises(RepositoryNotFoundError):
        HfApi().model_info("org/missing")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/missing", "config.json")


def test_unknown_revision_and_file_map_to_their_errors(fake_hub: FakeHub, repo: str) -> None:
    with pytest.raises(RevisionNotFoundError):
        HfApi().model_info("org/tiny", revision="nope")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download("org/tiny", "missing.json")


def test_a_cut_connection_is_retried_from_the_start_within_the_first_chunk(fake_hub: FakeHub, repo: str) -> None:
    # huggingface_hub 2.4.0 reads in 10 MiB chunks: bytes of an unfinished chunk are lost, so a cut
    # before the first chunk completes means a second GET of the whole file, without Range.
    fake_hub.cut_after["model.safetensors"] = 4096
    path = hf_hub_download("org/tiny", "model.safetensors")
    assert pathlib.Path(path).read_bytes() == WEIGHTS
    gets = fake_hub.requests_for("model.safetensors", "GET")
    assert [g[2].get("range") for g in gets] == [None, None]
    assert "model.safetensors" not in fake_hub.cut_after  # a one-shot cut is used up


def test_a_cut_after_a_full_chunk_resumes_with_a_range_request(fake_hub: FakeHub) -> None:
    chunk = huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE
    big = hashlib.sha256(b"x").digest() * ((chunk + chunk // 2) // 32)
    fake_hub.add_repo("org/big", {"big.bin": big})
    fake_hub.cut_after["big.bin"] = chunk + 1000
    assert pathlib.Path(hf_hub_download("org/big", "big.bin")).read_bytes() == big
    gets = fake_hub.requests_for("big.bin", "GET")
    assert [g[2].get("range") for g in gets] == [None, f"bytes={chunk}-"]


def test_a_cut_that_never_heals_fails_the_download(fake_hub: FakeHub, repo: str) -> None:
    fake_hub.cut_after["config.json"] = 0
    fake_hub.cut_always = True
    with pytest.raises(Exception, match="peer closed connection"):
        hf_hub_download("org/tiny", "config.json")
    assert len(fake_hub.requests_for("config.json", "GET")) == 6  # the first try and 5 retries


def test_a_short_body_fails_the_clients_size_check(fake_hub: FakeHub, repo: str) -> None:
    fake_hub.short_body["model.safetensors"] = 10
    with pytest.raises(OSError, match="Consistency check failed"):
        hf_hub_download("org/tiny", "model.safetensors")


def test_corrupt_flips_one_byte_and_keeps_the_size(fake_hub: FakeHub, repo: str) -> None:
    fake_hub.corrupt["model.safetensors"] = 5
    data = pathlib.Path(hf_hub_download("org/tiny", "model.safetensors")).read_bytes()
    assert len(data) == len(WEIGHTS) and data != WEIGHTS
    assert data[5] == WEIGHTS[5] ^ 0xFF and data[6:] == WEIGHTS[6:]


def test_ignore_range_answers_the_whole_file(fake_hub: FakeHub, repo: str) -> None:
    fake_hub.ignore_range = True
    response = get_session().get(hf_hub_url("org/tiny", "model.safetensors"), headers={"Range": "bytes=0-9"})
    assert response.status_code == 200 and response.content == WEIGHTS


def test_garbage_answers_are_not_json(fake_hub: FakeHub, repo: str) -> None:
    fake_hub.garbage = True
    with pytest.raises(ValueError):
        HfApi().model_info("org/tiny")


def test_files_on_disk_are_served_and_hashed(tmp_path: pathlib.Path) -> None:
    weights = tmp_path / "w.gguf"
    weights.write_bytes(WEIGHTS)
    with FakeHub(root=tmp_path / "hub") as hub:
        hub.add_repo("solo", {"w.gguf": weights, "readme.md": b"# hi"})
        response = get_session().get(f"{hub.url}/solo/resolve/main/w.gguf", headers={"Range": "bytes=-16"})
        assert response.status_code == 206 and response.content == WEIGHTS[-16:]
        assert response.headers["ETag"] == f'"{hashlib.sha256(WEIGHTS).hexdigest()}"'
        assert (tmp_path / "hub" / "blobs" / hashlib.sha256(b"# hi").hexdigest()).read_bytes() == b"# hi"


def test_a_stand_in_is_served_at_its_size_as_its_prefix_then_fill(fake_hub: FakeHub) -> None:
    prefix = b"GGUF header bytes"
    fake_hub.add_repo("org/big", {"w.gguf": StandIn(prefix, 3 * 1024 * 1024 + 5)}, library_name="gguf")
    info = HfApi().model_info("org/big", files_metadata=True)
    assert info.siblings[0].size == 3 * 1024 * 1024 + 5 and info.library_name == "gguf"
    url = hf_hub_url("org/big", "w.gguf")
    head = get_session().get(url, headers={"Range": "bytes=0-31"})
    assert head.status_code == 206 and head.content == prefix + bytes(32 - len(prefix))
    tail = get_session().get(url, headers={"Range": "bytes=-4"})
    assert tail.content == bytes(4)
    # Up to 16 MiB the digest is the whole content's, so a download passes the client's checks.
    whole = prefix + bytes(3 * 1024 * 1024 + 5 - len(prefix))
    assert info.siblings[0].lfs.sha256 == hashlib.sha256(whole).hexdigest()
    path = hf_hub_download("org/big", "w.gguf")
    assert pathlib.Path(path).read_bytes() == whole


def test_a_huge_stand_in_costs_no_hashing_and_reads_at_any_offset(fake_hub: FakeHub) -> None:
    size = 60 * 10**9
    fake_hub.add_repo("org/huge", {"w.gguf": StandIn(b"head", size), "README.md": StandIn(b"# hi", 100, fill=b" ")})
    info = HfApi().model_info("org/huge", files_metadata=True)
    sizes = {s.rfilename: (s.size, s.lfs) for s in info.siblings}
    assert sizes["w.gguf"][0] == size and len(sizes["w.gguf"][1].sha256) == 64
    assert sizes["README.md"] == (100, None)
    middle = get_session().get(hf_hub_url("org/huge", "w.gguf"), headers={"Range": "bytes=50000000000-50000000007"})
    assert middle.status_code == 206 and middle.content == bytes(8)
    readme = get_session().get(hf_hub_url("org/huge", "README.md"))
    assert readme.content == b"# hi" + b" " * 96


def test_a_stand_in_refuses_a_prefix_longer_than_its_size() -> None:
    with pytest.raises(ValueError):
        StandIn(b"12345", 4)
    with pytest.raises(ValueError):
        StandIn(b"", 4, fill=b"ab")
