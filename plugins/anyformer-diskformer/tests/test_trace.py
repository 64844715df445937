"""Routing traces are recorded during generation and replayed: LRU replays the live cache, Belady is optimal."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

import anyformer
from anyformer import AnyformerError, ErrorCode, GenerateOptions, Request
from anyformer.plugin import read_gguf_header
from anyformer_diskformer.model import DiskformerModel
from anyformer_diskformer.plan import plan_from_header
from anyformer_diskformer.trace import TRACE_ENV, read_trace, replay_belady, replay_lru

MESSAGES = [{"role": "user", "content": "tell me about the sea"}]


def optimal_hits(accesses: list[tuple[int, int]], slots: int) -> int:
    """The most hits any eviction choice gets, by trying every choice (tiny traces only)."""

    @functools.cache
    def best(i: int, held: frozenset[tuple[int, int]]) -> int:
        if i == len(accesses):
            return 0
        key = accesses[i]
        if key in held:
            return 1 + best(i + 1, held)
        if len(held) < slots:
            return best(i + 1, held | {key})
        return max(best(i + 1, (held - {victim}) | {key}) for victim in held)

    return best(0, frozenset())


def test_belady_is_the_optimum_and_never_below_lru():
    rng = np.random.default_rng(0)
    for _ in range(60):
        n, keys, slots = int(rng.integers(1, 13)), int(rng.integers(1, 6)), int(rng.integers(1, 4))
        trace = [(0, int(k)) for k in rng.integers(0, keys, size=n)]
        assert replay_belady(trace, slots) == optimal_hits(trace, slots)
        assert replay_lru(trace, slots) <= replay_belady(trace, slots)


def test_a_cyclic_trace_defeats_lru_but_not_belady():
    trace = [(0, e) for e in [0, 1, 2] * 4]
    assert replay_lru(trace, 2) == 0
    assert replay_belady(trace, 2) == optimal_hits(trace, 2) == 5


def test_generation_writes_a_trace_whose_lru_replay_is_the_live_cache(moe_top4, tmp_path, monkeypatch):
    path = tmp_path / "routing.jsonl"
    monkeypatch.setenv(TRACE_ENV, str(path))
    plan = plan_from_header(read_gguf_header(moe_top4), 128)
    slots = 3 * 4  # three layers' top-4 experts: the cache of every layer at once, at most
    # No prefetch: its read-ahead would take slots out of the pool the replay assumes.
    request = Request(
        context=128, options={"pool_bytes": slots * plan.one_expert_bytes, "prefetch": 0, "cache_policy": "lru"}
    )
    model = DiskformerModel.open(anyformer.describe(moe_top4), request, lambda event: None)
    try:
        list(model.generate(MESSAGES, GenerateOptions(max_new_tokens=16)))
        stats = model.cache_stats
    finally:
        model.dispose()
    assert stats is not None
    steps = path.read_text().splitlines()
    assert 2 <= len(steps) <= 17  # the prompt, then one step per token generated before any stop
    accesses = read_trace(str(path))
    assert len(accesses) == stats.lookups
    assert replay_lru(accesses, slots) == stats.hits
    assert stats.hits <= replay_belady(accesses, slots) <= len(accesses) - len(set(accesses))
    assert replay_belady(accesses, 10**6) == len(accesses) - len(set(accesses))


def test_a_bad_trace_line_is_a_bad_request(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"accesses": [[0, 1]]}) + "\nnot json\n")
    with pytest.raises(AnyformerError) as caught:
        read_trace(str(path))
    assert caught.value.code is ErrorCode.BAD_REQUEST and ":2" in caught.value.message


def test_an_unwritable_trace_path_is_a_bad_request_at_load(moe_f32, tmp_path, monkeypatch):
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "no-such-folder" / "trace.jsonl"))
    with pytest.raises(AnyformerError) as caught:
        DiskformerModel.open(anyformer.describe(moe_f32), Request(context=64), lambda event: None)
    assert caught.value.code is ErrorCode.BAD_REQUEST
