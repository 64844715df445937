"""Prefetch reads the next layer's likely experts ahead: the logits stay the same, fewer lookups wait on a read."""

from __future__ import annotations

import numpy as np
import pytest
from diskformer_reference import PROMPT

import anyformer
from anyformer import AnyformerError, ErrorCode, Request
from anyformer.plugin import read_gguf_header
from anyformer_diskformer.engine import DiskformerModel
from anyformer_diskformer.expert_cache import CacheStats
from anyformer_diskformer.plan import plan_from_header
from anyformer_diskformer.prefetch import likely_experts

STEPS = 24


def run(path: str, **options: object) -> tuple[np.ndarray, CacheStats, int]:
    """Every step's logits for the prompt and its greedy continuation, the cache's counters, the prefetch width."""
    try:
        model = DiskformerModel.open(anyformer.describe(path), Request(context=64, options=options), lambda e: None)
    except AnyformerError as exc:
        if options.get("device") == "gpu" and exc.code is ErrorCode.BACKEND_CRASHED:
            pytest.skip(f"no GPU adapter for wgpu: {exc}")
        raise
    try:
        engine = model.engine
        assert engine is not None
        rows = [engine.forward(PROMPT, 0)]
        for step in range(STEPS):
            rows.append(engine.forward([int(np.argmax(rows[-1][-1]))], len(PROMPT) + step))
        stats, width = engine.cache.stats, model.prefetch_width
    finally:
        model.dispose()
    return np.concatenate(rows), stats, width


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_prefetch_keeps_the_logits_and_raises_the_hit_rate(moe_top4, device):
    plan = plan_from_header(read_gguf_header(moe_top4), 64, device)
    # The same cache of one layer's top-4 both ways (under LRU over three layers it never hits, so every hit is
    # prefetch's); with prefetch the pool also holds two layers' guessed top-4 (the guesses being taken and the
    # next layer's), the read-ahead's own bytes.
    plain, without, width = run(
        moe_top4, device=device, pool_bytes=plan.min_cache_bytes, prefetch=0, cache_policy="lru"
    )
    assert width == 0 and without.prefetched == 0 and without.prefetch_wasted == 0
    pool = plan.min_cache_bytes + 8 * plan.one_expert_bytes
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
