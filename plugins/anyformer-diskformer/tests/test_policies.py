"""Eviction policies: LRU as the independent replay, LRFU between LRU and LFU, reuse within the budget and
ahead of LRU on skewed routing, none above Belady."""

from __future__ import annotations

import numpy as np
import pytest

import anyformer
from anyformer import AnyformerError, ErrorCode, GenerateOptions, Request
from anyformer.plugin import read_gguf_header
from anyformer_diskformer.cache.expert_cache import ExpertCache, HostStore
from anyformer_diskformer.cache.expert_reader import ExpertSlices
from anyformer_diskformer.cache.policies import LRFU, LRU, LayerReuse, make_policy, replay
from anyformer_diskformer.model import DiskformerModel
from anyformer_diskformer.plan import plan_from_header
from anyformer_diskformer.trace import TRACE_ENV, read_trace, replay_belady, replay_lru, skewed_trace


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
    with pytest.raises(ValueError, match="reuse, lrfu, lru"):
        make_policy("fifo", 2)


@pytest.mark.parametrize("name", ["lrfu", "reuse"])
def test_the_live_cache_is_its_replay(moe_top4, tmp_path, monkeypatch, name):
    path = tmp_path / "routing.jsonl"
    monkeypatch.setenv(TRACE_ENV, str(path))
    plan = plan_from_header(read_gguf_header(moe_top4), 128)
    # The CPU engine asks for one expert at a time; the GPU engine pins a layer's experts while it fills
    # them, which LRFU (unlike LRU) can feel, so the plain replay models the CPU engine's cache.
    options = {"pool_bytes": 10 * plan.one_expert_bytes, "cache_policy": name, "device": "cpu", "prefetch": 0}
    model = DiskformerModel.open(anyformer.describe(moe_top4), Request(context=128, options=options), lambda e: None)
    try:
        list(model.generate([{"role": "user", "content": "hello there"}], GenerateOptions(max_new_tokens=16)))
        stats = model.cache_stats
    finally:
        model.dispose()
    accesses = read_trace(str(path))
    assert stats is not None and stats.evictions > 0
    assert stats.hits == replay(accesses, 10, make_policy(name, 3))


def test_an_unknown_cache_policy_option_is_a_bad_request(moe_f32):
    with pytest.raises(AnyformerError) as caught:
        DiskformerModel.open(
            anyformer.describe(moe_f32), Request(context=64, options={"cache_policy": "fifo"}), lambda e: None
        )
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_reuse_never_beats_belady():
    for trace, slots in random_traces(50):
        assert replay(trace, slots, LayerReuse(1)) <= replay_belady(trace, slots)
    trace = skewed_trace(4, 32, 4, 40, seed=3)
    for slots in (4, 8, 16, 32, 64):
        assert replay(trace, slots, LayerReuse(4)) <= replay_belady(trace, slots)


def test_reuse_replays_deterministically():
    trace = skewed_trace(4, 32, 4, 40, seed=5)
    assert trace == skewed_trace(4, 32, 4, 40, seed=5)
    assert trace != skewed_trace(4, 32, 4, 40, seed=6)
    for slots in (6, 12, 24):
        assert replay(trace, slots, LayerReuse(4)) == replay(trace, slots, LayerReuse(4))


def test_reuse_beats_lru_on_skewed_routing():
    # Qwen3-30B's routing shape at 8 layers: 128 experts, top-8, so a token asks for 64 experts.
    trace = skewed_trace(8, 128, 8, 48, zipf=1.0, stay=0.5, seed=0)
    n = len(trace)
    # Below one token's experts LRU evicts each just before its next use; reuse keeps the likely ones.
    for slots in (24, 55):
        assert replay(trace, slots, LayerReuse(8)) / n > replay_lru(trace, slots) / n + 0.15
    # With room for a few tokens' experts it stays about as good as LRU.
    for slots in (128, 256):
        assert replay(trace, slots, LayerReuse(8)) / n > replay_lru(trace, slots) / n - 0.03


def test_reuse_keeps_the_frequent_experts_of_a_layer_over_one_offs():
    trace = []
    for token in range(40):
        # Layer 1's second and third experts are new every token.
        trace += [(0, 0), (0, 1), (1, 0), (1, 100 + 2 * token), (1, 101 + 2 * token)]
    # Four slots: the two of layer 0 and layer 1's expert 0 are kept, the one-offs take turns in the fourth;
    # LRU lets the second one-off evict a kept expert every token.
    # In the first token every expert has one use, and the tie goes to layer 1's least recent, expert 0:
    # one miss more than Belady, then none.
    hits = replay(trace, 4, LayerReuse(2))
    assert hits == 3 * 39 - 1 == replay_belady(trace, 4) - 1
    assert replay_lru(trace, 4) < hits


class CountingStore(HostStore):
    """A host store that checks the bytes it holds at every put."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.live = 0
        self.peak = 0

    def put(self, key: tuple[int, int], slices: ExpertSlices) -> ExpertSlices:
        self.live += slices.nbytes
        self.peak = max(self.peak, self.live)
        assert self.live <= self.capacity
        return slices

    def drop(self, key: tuple[int, int], entry: ExpertSlices) -> None:
        self.live -= entry.nbytes


@pytest.mark.parametrize("pinned", [False, True])
def test_reuse_never_exceeds_the_byte_budget(moe_top4, pinned):
    header = read_gguf_header(moe_top4)
    one = plan_from_header(header, 128).one_expert_bytes
    capacity = int(5.5 * one)  # not a whole number of experts
    store = CountingStore(capacity)
    cache: ExpertCache[ExpertSlices] = ExpertCache(moe_top4, header, 3, 16, capacity, LayerReuse(3), store)
    trace = skewed_trace(3, 16, 4, 30, seed=2)
    with cache:
        if pinned:  # as the GPU engine asks: a layer's experts at once, pinned while it fills
            for start in range(0, len(trace), 4):
                layer = trace[start][0]
                cache.fetch(layer, [e for _, e in trace[start : start + 4]])
                assert cache.held_bytes <= capacity
        else:
            for layer, expert in trace:
                cache.get(layer, expert)
                assert cache.held_bytes <= capacity
        assert cache.stats.evictions > 0 and store.peak > 4 * one
    assert store.live == 0


def test_the_policy_does_not_change_the_logits(moe_top4):
    plan = plan_from_header(read_gguf_header(moe_top4), 64)
    ids = [1, 5, 9, 3, 7, 2, 8, 4]
    logits = {}
    for name in ("lru", "reuse"):
        options = {"pool_bytes": plan.min_cache_bytes, "cache_policy": name, "device": "cpu", "prefetch": 0}
        model = DiskformerModel.open(anyformer.describe(moe_top4), Request(context=64, options=options), lambda e: None)
        try:
            engine = model.engine
            assert engine is not None
            logits[name] = np.concatenate([engine.forward([t], i) for i, t in enumerate(ids)])
            assert engine.cache.stats.evictions > 0
        finally:
            model.dispose()
    assert np.array_equal(logits["lru"], logits["reuse"])


def test_reuse_keeps_the_next_layers_predicted_experts():
    policy = LayerReuse(2)
    for key in [(1, 5), (0, 0), (0, 1), (0, 0), (0, 1)]:  # layer 0's two were used twice, (1, 5) once
        policy.touch(key)
    assert policy.victim() == (1, 5)
    policy.expect([(1, 5)])
    assert policy.victim() != (1, 5)
    assert policy.victim(exclude={(0, 0), (0, 1)}) == (1, 5)  # the only one left is still given up
    policy.expect([])
    assert policy.victim() == (1, 5)


class _KeyByKeyReuse(LayerReuse):
    """The reuse policy's victim ranked one key at a time (how it was written first): the oracle for the vector one."""

    def victim(self, exclude=()):
        n, current = self._n_layer, self._layer

        def rank(key):
            row = self._row[key]
            ahead = (key[0] - current - 1) % n
            return (key in self._expected, self._score(key), -ahead, int(self._last[row]))

        held = [k for k in self._keys if self._held[self._row[k]]]
        return min((k for k in held if k not in exclude), key=rank)


@pytest.mark.parametrize("slots", [5, 24, 55, 128])
def test_reuse_chooses_the_victims_a_key_by_key_ranking_chooses(slots):
    """Every eviction of a replay, with predictions and pinned keys, is the key the one-at-a-time ranking names."""
    trace = skewed_trace(8, 128, 8, 24, zipf=1.0, stay=0.5, seed=2)
    fast, slow = LayerReuse(8), _KeyByKeyReuse(8)
    held: set[tuple[int, int]] = set()
    rng = np.random.default_rng(slots)
    evictions = 0
    for i, key in enumerate(trace):
        if i % 8 == 0:  # the next layer's router guesses a few experts
            guess = {(key[0] + 1) % 8, 0}
            expected = [(layer, int(e)) for layer in guess for e in rng.integers(0, 128, size=3)]
            fast.expect(expected)
            slow.expect(expected)
        if key not in held and len(held) >= slots:
            pinned = set(list(held)[:2]) if i % 5 == 0 else set()
            victim = fast.victim(pinned)
            assert victim == slow.victim(pinned)
            held.discard(victim)
            fast.evicted(victim)
            slow.evicted(victim)
            evictions += 1
        held.add(key)
        fast.touch(key)
        slow.touch(key)
    assert evictions > len(trace) // 4
