"""The CPU engine's logits match llama.cpp's at every step, with a cache that holds every expert and one that evicts.

llama.cpp runs with an f32 KV cache (``type_k``/``type_v`` 0) so that only the weights' own format
separates the two: with F32 weights both compute the same f32 products in a different order
(measured max difference 1e-6 on logits of magnitude ~2.5, tolerance 1e-4); with F16 weights
llama.cpp's CPU build also rounds each activation vector to f16 before the dot products (relative
error 2^-11 per element, measured max 1.5e-3, tolerance 5e-3).
"""

from __future__ import annotations

import numpy as np
import pytest
from diskformer_reference import CPU_CASES, CTX, EXACT_GELU_TOLERANCE, GEMMA4_CASES, STEPS, greedy_steps, llama_steps

from anyformer_diskformer.arch.registry import read_moe_config
from anyformer_diskformer.cache.expert_cache import ExpertCache
from anyformer_diskformer.compute.routing import route
from anyformer_diskformer.engine_choice import cpu_engine_class
from anyformer_diskformer.engines.cpu.gemma4 import gelu as exact_gelu
from anyformer_diskformer.engines.cpu.qwen35moe import imrope_turns
from anyformer_gguf_gpu.gguf_file import GGUFFile


def engine_steps(path: str, experts_held: int | None) -> tuple[np.ndarray, list[int], ExpertCache]:
    """The engine's logits for the same steps; the cache holds every expert (None) or ``experts_held``."""
    gguf = GGUFFile(path)
    config = read_moe_config(gguf.header)
    total = config.n_layer * config.n_expert
    probe = ExpertCache(path, gguf.header, config.n_layer, config.n_expert, 10**12)
    capacity = probe.expert_bytes * (experts_held or total)
    probe.close()
    cache = ExpertCache(path, gguf.header, config.n_layer, config.n_expert, capacity)
    engine = cpu_engine_class(config)(gguf, config, cache, CTX)
    gguf.close()
    logits, tokens = greedy_steps(engine.forward)
    return logits, tokens, cache


@pytest.mark.parametrize(("fixture", "tolerance"), CPU_CASES)
@pytest.mark.parametrize("evicting", [False, True])
def test_logits_and_greedy_text_match_llama_cpp(request, fixture, tolerance, evicting):
    path = request.getfixturevalue(fixture)
    want, want_tokens = llama_steps(path)
    config = read_moe_config(GGUFFile(path).header)
    # The smallest working cache: one layer's top-k experts, so each layer evicts the one before it.
    got, tokens, cache = engine_steps(path, config.n_expert_used if evicting else None)
    assert got.shape == want.shape
    assert np.abs(got - want).max() < tolerance
    assert tokens == want_tokens
    if evicting:
        assert cache.stats.hits == 0 and cache.stats.evictions > STEPS
        assert cache.held_bytes <= cache.capacity_bytes
    else:
        assert cache.stats.evictions == 0 and cache.stats.hits > 0


def test_the_router_normalises_the_top_k_softmax_weights():
    logits = np.array([[0.0, 2.0, 1.0, 2.0]], dtype=np.float32)
    experts, weights = route(logits, 2, normalise=True)
    assert experts.tolist() == [[1, 3]]  # a tie goes to the lower index
    np.testing.assert_allclose(weights, [[0.5, 0.5]])
    experts, weights = route(logits, 2, normalise=False)
    p = np.exp(logits[0]) / np.exp(logits[0]).sum()
    np.testing.assert_allclose(weights, [[p[1], p[3]]], rtol=1e-6)


def test_the_sigmoid_router_chooses_by_biased_probability_in_the_best_groups_and_weights_unbiased():
    logits = np.array([[2.0, 1.0, 0.0, -3.0, -1.0, 3.0, -2.0, 0.2]], dtype=np.float32)
    p = 1.0 / (1.0 + np.exp(-logits[0]))
    bias = np.array([0, 0, 0.6, 0, 0, 0, 0, 0], dtype=np.float32)
    # Groups of two: (0,1) (2,3) (4,5) (6,7); sums of the two best biased probabilities pick (0,1) and (4,5)
    # over (2,3), whose expert 2 alone would otherwise beat expert 1.
    sums = [(p + bias)[g : g + 2].sum() for g in range(0, 8, 2)]
    assert np.argsort(sums)[::-1][:2].tolist() == [0, 2]
    experts, weights = route(logits, 3, normalise=False, gating="sigmoid", bias=bias, n_group=4, n_group_used=2)
    assert experts.tolist() == [[5, 0, 1]]
    np.testing.assert_allclose(weights, [[p[5], p[0], p[1]]], rtol=1e-6)
    experts, _ = route(logits, 3, normalise=False, gating="sigmoid", bias=bias)
    assert experts.tolist() == [[2, 5, 0]]  # without groups the bias lifts expert 2 to the top


def test_interleaved_sections_turn_the_pairs_of_the_first_three_sections_only():
    # Sector i % 4 of sections (1, 2, 1, 0): 0 -> t, 1 -> h, 2 -> w, 3 -> t again but past t's one pair: no turn.
    assert imrope_turns(4, (1, 2, 1, 0)).tolist() == [True, True, True, False]
    # Qwen3.5's (11, 11, 10, 0) over 32 pairs: every pair turns.
    assert imrope_turns(32, (11, 11, 10, 0)).all()


def llama_cpu_gelu(x: np.ndarray) -> np.ndarray:
    """GELU as llama.cpp's CPU build computes it: a table of f16 results looked up by the input rounded to f16
    (0 below -10, the input itself above 10)."""
    looked_up = exact_gelu(x.astype(np.float16).astype(np.float32)).astype(np.float16).astype(np.float32)
    return np.where(x <= -10, 0.0, np.where(x >= 10, x, looked_up)).astype(np.float32)


@pytest.mark.parametrize("fixture", GEMMA4_CASES)
@pytest.mark.parametrize("evicting", [False, True])
def test_gemma4_logits_and_greedy_text_match_llama_cpp(request, monkeypatch, fixture, evicting):
    """With llama.cpp's f16 GELU table reproduced, every step's logits agree within 1e-3 (measured 3.1e-4; what
    remains grows with the position, from 1e-6 at the first); with the exact GELU the engine keeps, llama.cpp's
    rounding of every GELU input and output to f16 moves them by up to 7e-3 (see the next test)."""
    import anyformer_diskformer.engines.cpu.gemma4 as gemma4

    path = request.getfixturevalue(fixture)
    want, want_tokens = llama_steps(path)
    config = read_moe_config(GGUFFile(path).header)
    monkeypatch.setattr(gemma4, "gelu", llama_cpu_gelu)
    got, tokens, cache = engine_steps(path, config.n_expert_used if evicting else None)
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 1e-3
    assert tokens == want_tokens
    if evicting:
        assert cache.stats.hits == 0 and cache.stats.evictions > STEPS
    else:
        assert cache.stats.evictions == 0 and cache.stats.hits > 0


def test_the_exact_gelu_greedy_text_is_llama_cpps_and_its_gelu_within_f16_rounding(gemma4_f32):
    x = np.linspace(-12, 12, 10001, dtype=np.float32)
    # f16 rounding of the input (relative 2^-11, GELU's slope is at most ~1.13) and of the result.
    assert np.all(np.abs(exact_gelu(x) - llama_cpu_gelu(x)) <= 2.0**-9 * np.maximum(1.0, np.abs(x)))
    want, want_tokens = llama_steps(gemma4_f32)
    got, tokens, _ = engine_steps(gemma4_f32, None)
    assert tokens == want_tokens
    assert np.abs(got - want).max() < EXACT_GELU_TOLERANCE
