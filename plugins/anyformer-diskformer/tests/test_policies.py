"""Eviction policies: LRU as the independent replay, LRFU between LRU and LFU, never above Belady."""

from __future__ import annotations

import numpy as np
import pytest

import anyformer
from anyformer import AnyformerError, ErrorCode, GenerateOptions, Request
from anyformer.plugin import read_gguf_header
from anyformer_diskformer.engine import DiskformerModel
from anyformer_diskformer.plan import plan_from_header
from anyformer_diskformer.policies import LRFU, LRU, make_policy, replay
from anyformer_diskformer.trace import TRACE_ENV, read_trace, replay_belady, replay_lru


def random_traces(count: int) -> list[tuple[list[tuple[int, int]], int]]:
    rng = np.random.default_rng(1)
    traces = []
    for _ in range(count):
        n, keys = int(rng.integers(1, 200)), int(rng.integers(1, 20))
        # Skewed popularity, as routers are: a few experts take most tokens.
        p = rng.dirichlet(np.full(keys, 0.3))
        traces.append(([(0, int(k)) for k in rng.choice(keys, size=n, p=p)], int(rng.integers(1, 8))))
    return traces


def test_the_lru_policy_replays_as_the_independent_lru():
    for trace, slots in random_traces(50):
        assert replay(trace, slots, LRU()) == replay_lru(trace, slots)


def test_lrfu_is_lru_at_a_tiny_half_life_and_never_beats_belady():
    for trace, slots in random_traces(50):
        assert replay(trace, slots, LRFU(half_life=1e-3)) == replay_lru(trace, slots)
        assert replay(trace, slots, LRFU()) <= replay_belady(trace, slots)


def test_lrfu_keeps_a_frequent_expert_that_lru_drops():
    hot, trace = (0, 0), []
    for i in range(1, 30):
        trace += [hot, hot, hot, (0, i), (0, i + 100)]  # two one-off experts between uses of the hot one
    # Two slots: LRU keeps the last two one-offs and loses the hot expert after every pair of them.
    assert replay(trace, 2, LRFU(half_life=1e6)) > replay_lru(trace, 2)


def test_an_unknown_policy_is_a_value_error():
    with pytest.raises(ValueError, match="lru and lrfu"):
        make_policy("fifo")


def test_the_live_cache_under_lrfu_is_its_replay(moe_top4, tmp_path, monkeypatch):
    path = tmp_path / "routing.jsonl"
    monkeypatch.setenv(TRACE_ENV, str(path))
    plan = plan_from_header(read_gguf_header(moe_top4), 128)
    # The CPU engine asks for one expert at a time; the GPU engine pins a layer's experts while it fills
    # them, which LRFU (unlike LRU) can feel, so the plain replay models the CPU engine's cache.
    options = {"pool_bytes": 10 * plan.one_expert_bytes, "cache_policy": "lrfu", "device": "cpu", "prefetch": 0}
    model = DiskformerModel.open(anyformer.describe(moe_top4), Request(context=128, options=options), lambda e: None)
    try:
        list(model.stream([{"role": "user", "content": "hello there"}], GenerateOptions(max_new_tokens=16)))
        stats = model.cache_stats
    finally:
        model.dispose()
    accesses = read_trace(str(path))
    assert stats is not None and stats.evictions > 0
    assert stats.hits == replay(accesses, 10, LRFU())


def test_an_unknown_cache_policy_option_is_a_bad_request(moe_f32):
    with pytest.raises(AnyformerError) as caught:
        DiskformerModel.open(
            anyformer.describe(moe_f32), Request(context=64, options={"cache_policy": "fifo"}), lambda e: None
        )
    assert caught.value.code is ErrorCode.BAD_REQUEST
