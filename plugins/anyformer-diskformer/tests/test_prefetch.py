"""Prefetch reads the next layer's likely experts ahead: the logits stay the same, fewer lookups wait on a read."""

from __future__ import annotations

import time

import numpy as np
import pytest
from diskformer_reference import greedy_steps, open_or_skip

from anyformer import AnyformerError, ErrorCode
from anyformer.plugin import read_gguf_header
from anyformer_diskformer.cache.expert_cache import CacheStats
from anyformer_diskformer.cache.expert_reader import ExpertSlices
from anyformer_diskformer.cache.prefetch import Prefetcher, likely_experts
from anyformer_diskformer.plan import plan_from_header

STEPS = 24


def run(path: str, **options: object) -> tuple[np.ndarray, CacheStats, int]:
    """Every step's logits for the prompt and its greedy continuation, the cache's counters, the prefetch width."""
    model = open_or_skip(path, **options)
    try:
        engine = model.engine
        assert engine is not None
        logits, _ = greedy_steps(engine.forward, STEPS)
        stats, width = engine.cache.stats, model.prefetch_width
    finally:
        model.dispose()
    return logits, stats, width


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_prefetch_keeps_the_logits_and_raises_the_hit_rate(moe_top4, device):
    plan = plan_from_header(read_gguf_header(moe_top4), 64, device)
    # The same cache of one layer's top-4 both ways (under LRU over three layers it never hits, so every hit is
    # prefetch's); with prefetch the pool also holds the next layer's guessed top-4, the read-ahead's own bytes.
    plain, without, width = run(
        moe_top4, device=device, pool_bytes=plan.min_cache_bytes, prefetch=0, cache_policy="lru"
    )
    assert width == 0 and without.prefetched == 0 and without.prefetch_wasted == 0
    pool = plan.min_cache_bytes + 4 * plan.one_expert_bytes
    ahead, with_, width = run(moe_top4, device=device, pool_bytes=pool, prefetch=4, cache_policy="lru")
    assert width == 4
    np.testing.assert_array_equal(ahead, plain)
    assert with_.lookups == without.lookups
    assert with_.prefetched > 0
    # Layer 0 is never guessed (the next token is not known), so at most two lookups in three are prefetched.
    assert with_.hit_rate > without.hit_rate + 0.15, (with_, without)
    print(f"{device}: hit rate {without.hit_rate:.2f} without prefetch, {with_.hit_rate:.2f} with")
    # Every byte read is a demand read, a prefetch used, or a prefetch wasted.
    assert with_.bytes_read == (with_.misses + with_.prefetched) * plan.one_expert_bytes + with_.prefetch_wasted


@pytest.mark.parametrize("fixture", ["gemma4_f32", "qwen35moe_alternating"])
@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_prefetch_keeps_the_logits_of_the_architectures_with_engines_of_their_own(request, fixture, device):
    """Gemma 4's guess is the next layer's own router (its scale, its weightless norm) on the residual after
    attention, qwen35moe's the next router after ``post_attention_norm``; on the GPU that router is one more
    product in the layer's submission, read back with the logits."""
    from anyformer_diskformer.arch.registry import read_moe_config

    path = request.getfixturevalue(fixture)
    header = read_gguf_header(path)
    plan, k = plan_from_header(header, 64, device), read_moe_config(header).n_expert_used
    plain, without, _ = run(path, device=device, pool_bytes=plan.min_cache_bytes, prefetch=0, cache_policy="lru")
    pool = plan.min_cache_bytes + k * plan.one_expert_bytes
    ahead, with_, width = run(path, device=device, pool_bytes=pool, prefetch=k, cache_policy="lru")
    assert width == k
    np.testing.assert_array_equal(ahead, plain)
    assert with_.lookups == without.lookups and with_.prefetched > 0
    assert with_.hit_rate > without.hit_rate + 0.15, (with_, without)


def _prefetched_by_layer(path: str, device: str, dense: int) -> dict[int, int]:
    """Greedy steps on ``path`` (whose layer ``dense`` is dense and the next a MoE layer) with prefetch: per layer, the
    lookups a prefetch served; the steps' logits are checked against a run without prefetch."""
    from anyformer_diskformer.arch.registry import read_moe_config

    header = read_gguf_header(path)
    config = read_moe_config(header)
    assert not config.is_moe_layer(dense) and config.is_moe_layer(dense + 1)
    plan, k = plan_from_header(header, 64, device), config.n_expert_used
    plain, _, _ = run(path, device=device, pool_bytes=plan.min_cache_bytes, prefetch=0, cache_policy="lru")
    model = open_or_skip(path, device=device, pool_bytes=plan.min_cache_bytes + k * plan.one_expert_bytes, prefetch=k)
    try:
        engine = model.engine
        assert engine is not None and model.prefetch_width == k
        cache, prefetched = engine.cache, dict.fromkeys(range(config.n_layer), 0)
        get = cache.get

        def counting_get(layer: int, expert: int):  # type: ignore[no-untyped-def]
            before = cache.stats.prefetched
            entry = get(layer, expert)
            prefetched[layer] += cache.stats.prefetched - before
            return entry

        cache.get = counting_get
        ahead, _ = greedy_steps(engine.forward, STEPS)
    finally:
        model.dispose()
    np.testing.assert_array_equal(ahead, plain)
    return prefetched


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_the_moe_layer_after_a_leading_dense_block_is_prefetched(bailingmoe2_f32, device):
    """bailingmoe2's layer 0 is a dense block: the guess for layer 1 (its router on layer 0's residual) starts
    reading during layer 0's MLP, so some of layer 1's lookups are prefetched; the logits stay those without."""
    prefetched = _prefetched_by_layer(bailingmoe2_f32, device, dense=0)
    assert prefetched[0] == 0 and prefetched[1] > 0, prefetched


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_gemma4_guesses_the_moe_layer_after_a_dense_layer(gemma4_dense_layer, device):
    """Layer 2 has no router: its residual goes through layer 3's router, and the reads of that guess start
    then (no lookup of layer 2 would start them), so some of layer 3's lookups are prefetched; the logits stay
    those without prefetch (which test_gpu_engine checks against the CPU engine and llama.cpp)."""
    prefetched = _prefetched_by_layer(gemma4_dense_layer, device, dense=2)
    # Layer 0 is never guessed, layer 2 has no experts; layer 3's guess comes from the dense layer 2.
    assert prefetched[0] == prefetched[2] == 0
    assert prefetched[3] > 0, prefetched
    assert prefetched[1] > 0, prefetched


def test_prefetch_is_off_when_the_budget_cannot_spare_it(moe_top4):
    plan = plan_from_header(read_gguf_header(moe_top4), 64)
    _, stats, width = run(moe_top4, device="cpu", pool_bytes=plan.min_cache_bytes, prefetch=4)
    assert width == 0 and stats.prefetched == 0


def test_a_negative_prefetch_is_a_bad_request(moe_top4):
    with pytest.raises(AnyformerError) as caught:
        run(moe_top4, device="cpu", prefetch=-1)
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_likely_experts_ranks_each_tokens_top_k_by_probability():
    logits = np.log(np.array([[0.5, 0.3, 0.1, 0.1], [0.1, 0.15, 0.65, 0.1]]))
    assert likely_experts(logits, 2, 8) == [2, 0, 1]  # 0.65, 0.5, then 0.3 + 0.15 for expert 1
    assert likely_experts(logits, 2, 2) == [2, 0]
    assert likely_experts(logits, 1, 8) == [2, 0]


class CountingReader:
    """A stand-in reader: each expert is 10 bytes, every read counted."""

    def __init__(self) -> None:
        self.reads: list[tuple[int, int]] = []

    def read(self, layer: int, expert: int) -> ExpertSlices:
        self.reads.append((layer, expert))
        slab = np.full(10, expert, dtype=np.uint8)
        return ExpertSlices(slab[:4], slab[4:7], slab[7:], (8, 8, 8))


def wait_for(prefetcher: Prefetcher, *keys: tuple[int, int]) -> None:
    """Wait (up to 10 s) until the reads of ``keys`` have finished."""
    deadline = time.monotonic() + 10
    while not all(prefetcher.ready(key) for key in keys):
        assert time.monotonic() < deadline, "the prefetcher's reads did not finish"
        time.sleep(0.001)


def test_reads_start_when_the_layer_before_has_its_experts():
    # The engine guesses layer l + 1 before layer l looks its experts up; the reads wait for those lookups.
    reader, stats = CountingReader(), CacheStats()
    prefetcher = Prefetcher(reader, stats, width=2, threads=1)  # type: ignore[arg-type]
    try:
        prefetcher.request(1, [4], held=set())
        prefetcher.request(1, [3, 5, 6], held=set())  # replaces the guess not started; at most width 2
        time.sleep(0.01)
        assert reader.reads == []
        prefetcher.start(0)
        wait_for(prefetcher, (1, 3), (1, 5))
        prefetcher.request(2, [7, 9], held={(2, 9)})  # layer 1 looks up next: its guesses stay
        taken = prefetcher.take((1, 3))
        assert taken is not None and int(taken.gate[0]) == 3
        assert stats.prefetch_wasted == 0
        # Layer 1's lookups end: what it did not take (expert 5) is wasted; layer 2's guess is read but for
        # expert 9, which the cache holds.
        prefetcher.start(1)
        assert stats.prefetch_wasted == 10 and prefetcher.take((1, 5)) is None
        assert prefetcher.take((2, 9)) is None
        assert prefetcher.take((2, 7)) is not None
        prefetcher.request(2, [1], held=set())
        prefetcher.start(2)  # a guess for the layer that just finished is stale: not read
        assert sorted(reader.reads) == [(1, 3), (1, 5), (2, 7)]
        assert stats.bytes_read == 30
    finally:
        prefetcher.close()
    assert stats.bytes_read == 30 and stats.prefetch_wasted == 10
