"""The wgpu engine's logits match llama.cpp's at every step, with a cache of GPU slots holding every expert and one
that evicts on every token (lavapipe in CI: ``ANYFORMER_SOFTWARE_GPU=1``).

Tolerances as the CPU engine's (see test_cpu_engine): the GPU sums the same f32 products in another
order (F32 weights), and llama.cpp's CPU build rounds activations to f16 before F16 products. Gemma 4
is also checked against the CPU engine, which computes GELU exactly as the GPU does.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from diskformer_reference import (
    CTX,
    EXACT_GELU_TOLERANCE,
    GEMMA4_CASES,
    PROMPT,
    STEPS,
    WGPU_CASES,
    gpu_engine_for,
    greedy_steps,
    llama_steps,
)

from anyformer import AnyformerError
from anyformer_diskformer.arch.registry import read_moe_config
from anyformer_diskformer.cache.expert_cache import ExpertCache
from anyformer_diskformer.engine_choice import cpu_engine_class
from anyformer_diskformer.engines.gpu.moe import GpuMoEEngine, GpuSlots
from anyformer_gguf_gpu.gguf_file import GGUFFile


@pytest.mark.parametrize(("fixture", "tolerance"), WGPU_CASES)
@pytest.mark.parametrize("evicting", [False, True])
def test_gpu_logits_and_greedy_text_match_llama_cpp(request, gpu, fixture, tolerance, evicting):
    path = request.getfixturevalue(fixture)
    want, want_tokens = llama_steps(path)
    config = read_moe_config(GGUFFile(path).header)
    engine = gpu_engine_for(gpu, path, config.n_expert_used if evicting else None)
    try:
        got, tokens = greedy_steps(engine.forward)
        stats = engine.cache.stats
        assert got.shape == want.shape
        assert np.abs(got - want).max() < tolerance
        assert tokens == want_tokens
        if evicting:
            # The smallest working cache: every layer evicts the one before it, so no lookup hits.
            assert stats.hits == 0 and stats.evictions > STEPS
            assert engine.cache.held_bytes <= engine.cache.capacity_bytes
            assert len(engine.slots._slots) == config.n_expert_used
        else:
            assert stats.evictions == 0 and stats.hits > 0
    finally:
        engine.release()


@functools.cache
def llama_and_cpu_steps(path: str) -> tuple[np.ndarray, list[int], np.ndarray, list[int]]:
    """llama.cpp's and the CPU engine's logits and greedy tokens for ``path`` (computed once a fixture): the
    references the GPU prompt-step tests hold each engine to."""
    want, want_tokens = llama_steps(path)
    cpu, cpu_tokens = cpu_steps(path)
    return want, want_tokens, cpu, cpu_tokens


def cpu_steps(path: str) -> tuple[np.ndarray, list[int]]:
    """The CPU engine's logits and greedy tokens for the same steps, every expert cached."""
    gguf = GGUFFile(path)
    config = read_moe_config(gguf.header)
    cache = ExpertCache(path, gguf.header, config.n_layer, config.n_expert, 10**9)
    engine = cpu_engine_class(config)(gguf, config, cache, CTX)
    gguf.close()
    try:
        return greedy_steps(engine.forward)
    finally:
        cache.close()


@pytest.mark.parametrize("fixture", GEMMA4_CASES)
@pytest.mark.parametrize("evicting", [False, True])
def test_gemma4_on_wgpu_matches_the_cpu_engine_and_llama_cpp(request, gpu, fixture, evicting):
    """Sliding and full layers of their own widths, a layer whose keys serve as values, a dense layer, GELU experts
    with output scales, soft-capped logits: within 1e-4 of the CPU engine (the same f32 graph and exact GELU,
    summed in another order: measured 1.4e-5) at every step, within llama.cpp's f16 GELU rounding of llama.cpp
    (measured 6.9e-3, as the CPU engine's), and the same 32 greedy tokens as both."""
    from anyformer_diskformer.engines.gpu.gemma4 import Gemma4GpuEngine

    path = request.getfixturevalue(fixture)
    want, want_tokens = llama_steps(path)
    cpu, cpu_tokens = cpu_steps(path)
    config = read_moe_config(GGUFFile(path).header)
    engine = gpu_engine_for(gpu, path, config.n_expert_used if evicting else None)
    try:
        assert isinstance(engine, Gemma4GpuEngine)
        got, tokens = greedy_steps(engine.forward)
        assert got.shape == want.shape == cpu.shape
        assert np.abs(got - cpu).max() < 1e-4
        assert np.abs(got - want).max() < EXACT_GELU_TOLERANCE
        assert tokens == want_tokens == cpu_tokens
        stats = engine.cache.stats
        if evicting:
            assert stats.hits == 0 and stats.evictions > STEPS
            assert len(engine.slots._slots) == config.n_expert_used
        else:
            assert stats.evictions == 0 and stats.hits > 0
    finally:
        engine.release()


def test_gpu_engine_reads_k_quant_experts_as_the_cpu_engine_does(gpu, tmp_path):
    """Q4_K experts (Q8_0 dense) through GPU slots against the CPU engine's numpy dequantisation of the same
    blocks; llama.cpp is not the reference here because it quantises activations before K-type products."""
    from anyformer_diskformer.engines.cpu.moe import CpuMoEEngine
    from anyformer_diskformer.testing import TinyMoE, write_tiny_moe

    path = str(tmp_path / "tiny-qwen3moe-q4k.gguf")
    write_tiny_moe(path, TinyMoE(n_embd=256, n_ff_exp=256, quant="Q8_0", expert_quant="Q4_K"), seed=6)
    config = read_moe_config(GGUFFile(path).header)
    engine = gpu_engine_for(gpu, path, config.n_expert_used)
    gguf = GGUFFile(path)
    cache = ExpertCache(path, gguf.header, config.n_layer, config.n_expert, 10**9)
    cpu = CpuMoEEngine(gguf, config, cache, CTX)
    gguf.close()
    try:
        want = cpu.forward(PROMPT, 0)
        got = engine.forward(PROMPT, 0)
        # Both sum f32 products of the same decoded weights, in a different order.
        assert np.abs(got - want).max() < 1e-3 * max(1.0, float(np.abs(want).max()))
        assert engine.cache.stats.evictions > 0
    finally:
        engine.release()
        cache.close()


def test_gemma4_reads_quantised_weights_as_the_cpu_engine_does(gpu, tmp_path):
    """Q8_0 dense matrices (q/k/v and gate/up stacked as stored), Q4_K experts in a cache of one layer's top-k,
    against the CPU engine's numpy dequantisation of the same blocks (llama.cpp quantises activations before
    these products, so it is not the reference here)."""
    from anyformer_diskformer.testing import TinyMoE, write_tiny_moe

    path = str(tmp_path / "tiny-gemma4-q8-q4k.gguf")
    spec = TinyMoE(
        architecture="gemma4", n_layer=4, n_embd=256, n_ff_exp=256, n_ff_shexp=64, quant="Q8_0", expert_quant="Q4_K"
    )
    write_tiny_moe(path, spec, seed=12)
    config = read_moe_config(GGUFFile(path).header)
    want, want_tokens = cpu_steps(path)
    engine = gpu_engine_for(gpu, path, config.n_expert_used)
    try:
        got, tokens = greedy_steps(engine.forward, 8)
        rows = got.shape[0]
        # Both sum f32 products of the same decoded weights, in another order (measured 1.2e-5 on logits of ~2.8).
        assert np.abs(got - want[:rows]).max() < 1e-4 * max(1.0, float(np.abs(want).max()))
        assert tokens == want_tokens[:8]
        assert engine.cache.stats.evictions > 0
    finally:
        engine.release()


def test_a_gpu_load_refused_part_way_gives_the_refusal_with_no_slot_made(gpu, moe_f32):
    from anyformer import ErrorCode

    gguf = GGUFFile(moe_f32)
    config = read_moe_config(gguf.header)
    made: list[GpuSlots] = []

    def too_small(slots: GpuSlots) -> ExpertCache[int]:
        made.append(slots)
        return ExpertCache(moe_f32, gguf.header, config.n_layer, config.n_expert, 1000, store=slots)

    try:
        with pytest.raises(AnyformerError) as caught:
            GpuMoEEngine(gpu, gguf, config, too_small, CTX)
    finally:
        gguf.close()
    assert caught.value.code is ErrorCode.BUDGET_TOO_SMALL
    assert made and made[0].gpu_bytes == 0
