"""The wgpu engine with ``cpu_experts`` (lavapipe in CI: ``ANYFORMER_SOFTWARE_GPU=1``): decoding computes the experts
its GPU cache misses on the CPU and adds their sum into the residual; every step's logits stay within llama.cpp's
tolerance and the greedy tokens equal its own, with a GPU cache of one layer's top-k (so most lookups miss); the load
option's bad values are BAD_REQUEST, the CPU engine ignores it with a note, Gemma 4 and qwen35moe refuse it."""

from __future__ import annotations

import numpy as np
import pytest
from diskformer_reference import PROMPT, gpu_engine_for, greedy_steps, llama_steps

import anyformer
from anyformer import AnyformerError, ErrorCode, Request
from anyformer_diskformer.arch.registry import read_moe_config
from anyformer_diskformer.model import DiskformerModel
from anyformer_gguf_gpu.gguf_file import GGUFFile

#: qwen3moe, qwen2moe (a gated shared expert after the CPU sum), bailingmoe2 (a leading dense layer, expert groups),
#: with test_gpu_engine's tolerances.
CASES = [("moe_f32", 1e-4), ("qwen2moe_f32", 1e-4), ("bailingmoe2_f32", 1e-4)]


def top_k_engine(gpu, path: str, threads: int = 2):
    """The wgpu engine of ``path`` with a GPU cache of one layer's top-k and cpu_experts on ``threads`` threads."""
    config = read_moe_config(GGUFFile(path).header)
    return gpu_engine_for(gpu, path, config.n_expert_used, cpu_threads=threads)


@pytest.mark.parametrize(("fixture", "tolerance"), CASES)
@pytest.mark.parametrize("threads", [1, 6])  # on the calling thread; more threads than experts (rows split)
def test_cpu_experts_logits_and_greedy_text_match_llama_cpp(request, gpu, fixture, tolerance, threads):
    path = request.getfixturevalue(fixture)
    want, want_tokens = llama_steps(path)
    engine = top_k_engine(gpu, path, threads)
    try:
        got, tokens = greedy_steps(engine.forward)
        stats = engine.cache.stats
        assert got.shape == want.shape
        assert np.abs(got - want).max() < tolerance
        assert tokens == want_tokens
        # Decoding computed experts on the CPU, and never evicted for them (the prompt step did its own evictions).
        assert stats.cpu_computed > 0
        assert stats.hits > 0  # and what the GPU cache held ran there, in the same layers
        assert engine.cache.held_bytes <= engine.cache.capacity_bytes
    finally:
        engine.release()


def test_the_cpu_experts_sum_is_what_moves_the_logits(gpu, moe_f32):
    """The check above can fail: with the CPU experts' sum dropped the logits leave llama.cpp's tolerance."""
    want, _ = llama_steps(moe_f32)
    engine = top_k_engine(gpu, moe_f32)
    try:
        runner = engine.runner
        compute = runner.weighted_sum

        def dropped(load, experts, weights, x):
            total, loaded = compute(load, experts, weights, x)
            return np.zeros_like(total), loaded

        runner.weighted_sum = dropped  # type: ignore[method-assign]
        got, _ = greedy_steps(engine.forward, steps=4)
        assert engine.cache.stats.cpu_computed > 0
        assert np.abs(got[len(PROMPT) :] - want[len(PROMPT) : len(PROMPT) + 4]).max() > 1e-2
    finally:
        engine.release()


def test_the_cache_fills_with_cpu_misses_while_it_has_room_and_never_evicts_for_them(gpu, moe_f32):
    """Decoding alone (one token a step from an empty cache): the experts read for the CPU are stored until the
    cache is full, and none is evicted."""
    config = read_moe_config(GGUFFile(moe_f32).header)
    engine = top_k_engine(gpu, moe_f32, threads=1)
    try:
        for pos, token in enumerate(PROMPT):
            engine.forward([token], pos)
        stats = engine.cache.stats
        assert stats.cpu_computed > 0 and stats.evictions == 0
        assert len(engine.slots._slots) == config.n_expert_used  # full: every slot made was filled from the CPU's reads
        assert stats.hits > 0  # and later steps ran what it held on the GPU
    finally:
        engine.release()


def open_model(path: str, **options: object) -> tuple[DiskformerModel, list[str]]:
    notes: list[str] = []
    request = Request(context=64, options=options)
    loaded = DiskformerModel.open(anyformer.describe(path), request, lambda e: notes.append(e.message or ""))
    return loaded, notes


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_cpu_experts_must_be_a_bool(gpu, moe_f32, value):
    with pytest.raises(AnyformerError) as caught:
        open_model(moe_f32, device="gpu", cpu_experts=value)
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert "cpu_experts" in str(caught.value)


@pytest.mark.parametrize(("fixture", "architecture"), [("gemma4_f32", "gemma4"), ("qwen35moe_f32", "qwen35moe")])
def test_engines_of_their_own_refuse_cpu_experts_naming_the_architecture(request, gpu, fixture, architecture):
    with pytest.raises(AnyformerError) as caught:
        open_model(request.getfixturevalue(fixture), device="gpu", cpu_experts=True)
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert architecture in str(caught.value)


def test_the_cpu_engine_ignores_cpu_experts_with_a_note(moe_f32):
    loaded, notes = open_model(moe_f32, device="cpu", cpu_experts=True)
    loaded.dispose()
    assert any("cpu_experts is ignored" in note for note in notes)


@pytest.mark.parametrize("direct_io", [False, True])
def test_the_load_option_reaches_the_gpu_engine(gpu, moe_f32, direct_io):
    """With direct_io off the CPU reads the experts from the file mapped (the page cache's pages); with it on,
    through the cache's reader (O_DIRECT, or its pread fallback where the file system refuses it): the same logits."""
    config = read_moe_config(GGUFFile(moe_f32).header)
    pool = config.n_expert_used * slot_bytes(moe_f32)
    loaded, _ = open_model(
        moe_f32, device="gpu", cpu_experts=True, threads=2, direct_io=direct_io, pool_bytes=pool, prefetch=0
    )
    reference = gpu_engine_for(loaded.engine.gpu, moe_f32, None)
    try:
        engine = loaded.engine
        assert engine is not None and engine.cpu_threads == 2
        assert (engine.mapped is not None) is (not direct_io)
        if not direct_io:
            assert engine.cache.reader.drop_pages is False  # the GPU's reads leave the CPU's pages in the page cache
        for pos, token in enumerate(PROMPT[:4]):
            got = engine.forward([token], pos)
            want = reference.forward([token], pos)
            assert np.abs(got - want).max() < 1e-5
        assert engine.cache.stats.cpu_computed > 0
    finally:
        loaded.dispose()
        reference.release()


def slot_bytes(path: str) -> int:
    """Bytes of one GPU slot of ``path``'s experts (GpuSlots sizes each for the largest of every layer)."""
    from anyformer_diskformer.arch.moe_config import EXPERT_TENSORS
    from anyformer_diskformer.cache.expert_reader import expert_spans

    header = GGUFFile(path).header
    config = read_moe_config(header)
    spans = expert_spans(header, config.n_layer, config.n_expert)
    return sum(max(s.length for (_, k), s in spans.items() if k == kind) for kind in EXPERT_TENSORS)


def test_mapped_experts_are_the_readers_bytes(moe_f32, qwen2moe_f32):
    from anyformer_diskformer.cache.expert_reader import ExpertReader, MappedExperts, expert_spans

    for path in (moe_f32, qwen2moe_f32):
        header = GGUFFile(path).header
        config = read_moe_config(header)
        spans = expert_spans(header, config.n_layer, config.n_expert)
        reader, mapped = ExpertReader(path, spans), MappedExperts(path, spans)
        try:
            for layer, expert in [(0, 0), (config.n_layer - 1, config.n_expert - 1), (0, 3)]:
                a, b = reader.read(layer, expert), mapped.read(layer, expert)
                assert a.types == b.types
                for x, y in ((a.gate, b.gate), (a.up, b.up), (a.down, b.down)):
                    np.testing.assert_array_equal(x, y)
        finally:
            reader.close()
            mapped.close()
        with pytest.raises(AnyformerError):
            mapped.read(0, 0)
