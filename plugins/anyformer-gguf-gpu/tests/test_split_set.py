"""A split set (``x-00001-of-00003.gguf`` ...) opened by its first shard reads as the unsplit file: the same
header facts and tensors, each tensor's bytes from the shard that holds it; a partial set is refused by name."""

from __future__ import annotations

import os
import shutil

import pytest

from anyformer.plugin import AnyformerError, ErrorCode, Model, ModelFile, Refusal
from anyformer_gguf_gpu.gguf_file import GGUFFile, read_model_header
from anyformer_gguf_gpu.split_set import missing_shard, partial_set_refusal, shard_of
from anyformer_gguf_gpu.testing import RandomModel, write_random_gguf
from anyformer_gguf_gpu.testing_split import write_split_set

_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")


def by_layer(name: str) -> int:
    """Shard 0 the embeddings and output, each layer's weights a shard by layer, its FFN the shard after."""
    if not name.startswith("blk."):
        return 0
    layer = int(name.split(".")[1])
    return (layer + (1 if ".ffn_" in name else 0)) % 3


@pytest.fixture(scope="module")
def unsplit_and_set(tmp_path_factory) -> tuple[str, list[str]]:
    folder = tmp_path_factory.mktemp("split")
    whole = str(folder / "tiny.gguf")
    write_random_gguf(whole, RandomModel(n_layer=3), seed=3)
    shards = write_split_set(whole, str(folder / "tiny"), 3, by_layer)
    return whole, shards


def test_the_set_reads_as_the_unsplit_file(unsplit_and_set):
    whole, shards = unsplit_and_set
    with GGUFFile(whole) as one, GGUFFile(shards[0]) as split:
        assert split.paths == tuple(shards)
        assert sorted(t.name for t in split.header.tensors) == sorted(t.name for t in one.header.tensors)
        assert {k: v for k, v in split.kv.items() if k not in _SPLIT_KEYS} == dict(one.kv)
        held = {split.place(t.name).shard for t in split.header.tensors}
        assert held == {0, 1, 2}
        for t in one.header.tensors:
            assert split.tensor(t.name).dims == t.dims
            assert bytes(split.raw(t.name)) == bytes(one.raw(t.name)), t.name
        assert split.header.parameter_count == one.header.parameter_count
        assert split.header.data_bytes >= one.header.data_bytes  # each shard pads its own data
    assert read_model_header(shards[0]).tensors == split.header.tensors


def test_a_layer_and_its_ffn_lie_in_different_shards(unsplit_and_set):
    _, shards = unsplit_and_set
    with GGUFFile(shards[0]) as split:
        assert split.place("blk.1.attn_q.weight").path == shards[1]
        assert split.place("blk.1.ffn_up.weight").path == shards[2]
        assert split.place("blk.2.ffn_up.weight").path == shards[0]


def test_a_missing_shard_is_refused_by_name(unsplit_and_set, tmp_path):
    _, shards = unsplit_and_set
    for shard in shards[::2]:
        shutil.copy(shard, tmp_path)
    with pytest.raises(AnyformerError) as info:
        GGUFFile(tmp_path / os.path.basename(shards[0]))
    assert info.value.code is ErrorCode.BAD_MODEL
    assert "tiny-00002-of-00003.gguf" in str(info.value) and "missing" in str(info.value)


def test_a_later_shard_is_not_opened_as_the_model(unsplit_and_set):
    _, shards = unsplit_and_set
    with pytest.raises(AnyformerError) as info:
        GGUFFile(shards[1])
    assert info.value.code is ErrorCode.BAD_MODEL
    assert "tiny-00001-of-00003.gguf" in str(info.value)


def test_shards_of_another_set_are_refused(unsplit_and_set, tmp_path):
    """Shard 2 taken from a set of another count: the names agree, split.count does not."""
    whole, shards = unsplit_and_set
    other = write_split_set(whole, str(tmp_path / "other"), 2, lambda name: 0 if name.startswith("token") else 1)
    shutil.copy(other[0], tmp_path / "mixed-00001-of-00002.gguf")
    shutil.copy(shards[1], tmp_path / "mixed-00002-of-00002.gguf")
    with pytest.raises(AnyformerError) as info:
        GGUFFile(tmp_path / "mixed-00001-of-00002.gguf")
    assert info.value.code is ErrorCode.BAD_MODEL and "split" in str(info.value)


def test_shard_names():
    assert shard_of("BF16/Model-BF16-00002-of-00004.gguf") == ("BF16/Model-BF16", 2, 4)
    assert shard_of("model.gguf") is None
    names = ["a-00001-of-00003.gguf", "a-00003-of-00003.gguf", "b.gguf"]
    assert missing_shard(names, "a-00001-of-00003.gguf") == "a-00002-of-00003.gguf"
    assert missing_shard([*names, "a-00002-of-00003.gguf"], "a-00003-of-00003.gguf") is None
    assert missing_shard(names, "b.gguf") is None


def _repo(*names: str) -> Model:
    return Model(repo="org/repo", source="hub", files=tuple(ModelFile(n, size=10) for n in names))


def test_a_repo_holding_only_a_partial_set_is_a_model_refusal():
    verdict = partial_set_refusal("x", _repo("Q8/m-00001-of-00003.gguf", "Q8/m-00003-of-00003.gguf", "mmproj-f16.gguf"))
    assert verdict is not None and verdict.code is Refusal.MODEL
    assert "Q8/m-00002-of-00003.gguf" in verdict.reason


def test_a_whole_candidate_beside_a_partial_set_is_not_refused_here():
    assert partial_set_refusal("x", _repo("m-00001-of-00002.gguf", "m-Q4_0.gguf")) is None
    assert partial_set_refusal("x", _repo("m-00001-of-00002.gguf", "m-00002-of-00002.gguf")) is None
