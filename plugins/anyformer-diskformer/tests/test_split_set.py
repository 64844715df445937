"""A qwen3moe split set, each layer's experts in other shards than its dense weights, opened by its first shard.

Every expert reader (pread, O_DIRECT, mmap) hands out the unsplit file's bytes; the plan counts every shard;
the CPU and wgpu engines' logits equal the unsplit file's bit for bit, with a cache holding every expert and
one evicting on every layer, and llama.cpp's on the set (loaded from its first shard) within the F32 tolerance.
A repo holding part of a set is a ``model`` refusal naming the missing shard.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from diskformer_reference import CTX, gpu_engine_for, greedy_steps

import anyformer
from anyformer import Caps, Refusal, Request
from anyformer.plugin import Model, ModelFile
from anyformer_diskformer import plugin
from anyformer_diskformer.arch.registry import read_moe_config
from anyformer_diskformer.cache.expert_cache import ExpertCache
from anyformer_diskformer.cache.expert_reader import ExpertReader, MappedExperts, expert_spans, open_reader
from anyformer_diskformer.engine_choice import cpu_engine_class
from anyformer_diskformer.plan import plan_for
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.testing_split import write_split_set

#: F32 weights: llama.cpp differs from the engines only in summation order (see test_cpu_engine).
TOLERANCE = 1e-4


def _shard(name: str) -> int:
    """Shard 0 the embeddings and output; layer L's dense weights shard L % 3, its gate experts the shard after,
    its up and down experts the one after that."""
    if not name.startswith("blk."):
        return 0
    layer = int(name.split(".")[1])
    if "ffn_gate_exps" in name:
        return (layer + 1) % 3
    if "_exps" in name:
        return (layer + 2) % 3
    return layer % 3


@pytest.fixture(scope="module")
def moe_set(moe_f32, tmp_path_factory) -> str:
    """moe_f32 (2 layers, 8 experts, top-2, F32) as three shards; the first shard's path."""
    folder = tmp_path_factory.mktemp("moe-split")
    return write_split_set(moe_f32, str(folder / "tiny-qwen3moe-F32"), 3, _shard)[0]


def test_the_experts_lie_apart_from_their_layers(moe_set):
    with GGUFFile(moe_set) as gguf:
        spans = expert_spans(gguf, 2, 8)
        for layer in range(2):
            dense = gguf.place(f"blk.{layer}.attn_q.weight").shard
            assert {spans[layer, kind].shard for kind in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")} == (
                {0, 1, 2} - {dense}
            )


@pytest.mark.parametrize("reader", ["pread", "direct", "mmap"])
def test_every_reader_hands_out_the_unsplit_files_experts(moe_f32, moe_set, reader):
    with GGUFFile(moe_f32) as one, GGUFFile(moe_set) as split:
        want_reader = ExpertReader(moe_f32, expert_spans(one, 2, 8))
        spans = expert_spans(split, 2, 8)
        got_reader = {
            "pread": lambda: ExpertReader(split.paths, spans),
            "direct": lambda: open_reader(split.paths, spans, direct=True),
            "mmap": lambda: MappedExperts(split.paths, spans),
        }[reader]()
    try:
        for layer in range(2):
            for expert in range(8):
                want, got = want_reader.read(layer, expert), got_reader.read(layer, expert)
                for part in ("gate", "up", "down"):
                    assert bytes(getattr(got, part)) == bytes(getattr(want, part)), (layer, expert, part)
                assert got.types == want.types
    finally:
        want_reader.close()
        got_reader.close()


def test_the_plan_counts_every_shard(moe_f32, moe_set):
    with GGUFFile(moe_f32) as gguf:
        summary = gguf.header.summary()
    whole, split = plan_for(moe_f32, summary, CTX), plan_for(moe_set, summary, CTX)
    assert not split.estimated
    assert (split.dense_bytes, split.expert_bytes_total, split.one_expert_bytes) == (
        whole.dense_bytes,
        whole.expert_bytes_total,
        whole.one_expert_bytes,
    )


def test_can_run_on_a_split_set_opens_none_of_its_shards(moe_set):
    from anyformer_conformance.io_spy import IOSpy

    model = anyformer.describe(moe_set)
    spy = IOSpy()
    with spy.watching():
        verdict = plugin.can_run(model, Caps(ram_bytes=16 * 2**30, cpu_count=2, store=True), Request())
    assert verdict.ok, verdict.reason
    assert spy.opened_under(os.path.dirname(moe_set)) == []


def _cpu_steps(path: str, evicting: bool) -> tuple[np.ndarray, list[int], ExpertCache]:
    gguf = GGUFFile(path)
    config = read_moe_config(gguf.header)
    probe = ExpertCache(path, gguf, config.n_layer, config.n_expert, 10**12)
    capacity = probe.expert_bytes * (config.n_expert_used if evicting else config.n_layer * config.n_expert)
    probe.close()
    cache = ExpertCache(path, gguf, config.n_layer, config.n_expert, capacity)
    engine = cpu_engine_class(config)(gguf, config, cache, CTX)
    gguf.close()
    logits, tokens = greedy_steps(engine.forward)
    return logits, tokens, cache


@pytest.fixture(scope="module")
def llama_on_the_set(moe_set) -> tuple[np.ndarray, list[int]]:
    pytest.importorskip("llama_cpp")
    from diskformer_reference import llama_steps

    return llama_steps(moe_set)


@pytest.mark.parametrize("evicting", [False, True], ids=["cached", "evicting"])
def test_cpu_logits_of_the_set_equal_the_unsplit_files(moe_f32, moe_set, llama_on_the_set, evicting):
    got, tokens, cache = _cpu_steps(moe_set, evicting)
    want, want_tokens, _ = _cpu_steps(moe_f32, evicting)
    assert np.array_equal(got, want) and tokens == want_tokens
    theirs, their_tokens = llama_on_the_set
    assert np.abs(got - theirs).max() < TOLERANCE and tokens == their_tokens
    assert (cache.stats.evictions > 0) == evicting


def _gpu_steps(gpu, path: str, evicting: bool) -> tuple[np.ndarray, list[int], int]:
    engine = gpu_engine_for(gpu, path, 2 if evicting else None)
    try:
        logits, tokens = greedy_steps(engine.forward)
        return logits, tokens, engine.cache.stats.evictions
    finally:
        engine.release()


@pytest.mark.parametrize("evicting", [False, True], ids=["cached", "evicting"])
def test_gpu_logits_of_the_set_equal_the_unsplit_files(gpu, moe_f32, moe_set, llama_on_the_set, evicting):
    got, tokens, evictions = _gpu_steps(gpu, moe_set, evicting)
    want, want_tokens, _ = _gpu_steps(gpu, moe_f32, evicting)
    assert np.array_equal(got, want) and tokens == want_tokens
    theirs, their_tokens = llama_on_the_set
    assert np.abs(got - theirs).max() < TOLERANCE and tokens == their_tokens
    assert (evictions > 0) == evicting


def test_can_run_names_the_missing_shard():
    from anyformer_diskformer.plugin import can_run

    files = (ModelFile("Q8_0/m-Q8_0-00001-of-00002.gguf", size=10), ModelFile("README.md", size=1))
    verdict = can_run(Model(repo="org/m", source="hub", files=files), Caps(ram_bytes=2**34), Request())
    assert verdict.code is Refusal.MODEL and "Q8_0/m-Q8_0-00002-of-00002.gguf" in verdict.reason


#: Load options covering each expert reader: O_DIRECT where the file system allows it (else pread, said in the
#: reader's note), pread, GPU slots, and the GPU engine's CPU experts over the mapped shards.
LOAD_OPTIONS = {
    "cpu": {"device": "cpu"},
    "cpu-pread": {"device": "cpu", "direct_io": False},
    "gpu": {"device": "gpu"},
    "gpu-cpu-experts-mmap": {"device": "gpu", "cpu_experts": True, "direct_io": False},
}


@pytest.mark.parametrize("options", list(LOAD_OPTIONS.values()), ids=list(LOAD_OPTIONS))
def test_the_load_reads_the_set_from_its_first_shard(moe_f32, moe_set, monkeypatch, options):
    """DiskformerModel.open on the path the file choice hands over (the first shard): the whole load path (dense
    weights, the plan, the expert readers of each option) gives the unsplit file's logits."""
    from pathlib import Path

    from diskformer_reference import open_or_skip

    import anyformer
    from anyformer_diskformer import model as engine_module

    def steps(path: str) -> tuple[np.ndarray, list[int]]:
        monkeypatch.setattr(
            engine_module, "fetch_chosen_gguf", lambda model, progress, backend, verdict: (path, Path(path))
        )
        monkeypatch.setattr(anyformer, "describe", lambda _: Model(repo="local/m", source="local"))
        loaded = open_or_skip(path, **options)
        try:
            if options.get("cpu_experts"):
                assert loaded.engine.mapped is not None  # the decoding steps read experts from the mapped shards
            return greedy_steps(loaded.engine.forward, steps=6)
        finally:
            loaded.dispose()

    got, tokens = steps(moe_set)
    want, want_tokens = steps(moe_f32)
    assert np.array_equal(got, want) and tokens == want_tokens


def test_the_load_of_a_partial_set_names_the_missing_shard(moe_set, tmp_path, monkeypatch):
    import os
    import shutil
    from pathlib import Path

    from anyformer import AnyformerError, ErrorCode
    from anyformer_diskformer import model as engine_module
    from anyformer_diskformer.model import DiskformerModel

    first = tmp_path / os.path.basename(moe_set)
    shutil.copy(moe_set, first)
    shutil.copy(moe_set.replace("-00001-of-", "-00003-of-"), tmp_path)
    monkeypatch.setattr(
        engine_module, "fetch_chosen_gguf", lambda model, progress, backend, verdict: (first.name, Path(first))
    )
    with pytest.raises(AnyformerError) as info:
        DiskformerModel.open(Model(repo="local/m", source="local"), Request(options={"device": "cpu"}), lambda e: None)
    assert info.value.code is ErrorCode.BAD_MODEL and "tiny-qwen3moe-F32-00002-of-00003.gguf" in str(info.value)
