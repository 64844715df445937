"""The ``parallel`` load option's automatic choice (the server's default): streams from threads and memory."""

from __future__ import annotations

from pathlib import Path

import pytest

import anyformer
from anyformer_llamacpp.estimate import kv_cache_bytes
from anyformer_llamacpp.parallel_option import auto_streams, pick_threads, streams_for
from anyformer_llamacpp.plugin import can_run


@pytest.mark.parametrize(("threads", "streams"), [(1, 2), (2, 4), (3, 6), (8, 16), (16, 16), (128, 16)])
def test_auto_asks_for_two_streams_a_decode_thread_from_2_to_16(threads: int, streams: int) -> None:
    assert auto_streams(threads) == streams


def test_auto_fits_half_the_memory_and_a_number_all_of_it() -> None:
    model, stream = 1000, 100  # host bytes: the model and each stream's KV region

    def host_bytes(n: int) -> int:
        return model + n * stream

    # 2 threads: auto asks for 4; 1,400 bytes hold them all.
    assert streams_for({"parallel": "auto"}, 2 * 1400, host_bytes, 2) == 4
    # Half of 2,600 bytes holds the model and 3 regions; a number asked for may take all 2,600.
    assert streams_for({"parallel": "auto"}, 2600, host_bytes, 2) == 3
    assert streams_for({"parallel": 4}, 2600, host_bytes, 2) == 4
    # Never fewer than one: a model one stream runs is never refused for the streams' sake.
    assert streams_for({"parallel": "auto"}, 1000, host_bytes, 2) == 1
    assert streams_for({}, 10**9, host_bytes, 2) == 1


def test_decode_threads_come_from_the_option_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYFORMER_LLAMACPP_THREADS", "3")
    assert (pick_threads({"threads": 5}), pick_threads({"threads": "6"}), pick_threads({})) == (5, 6, 3)


def test_the_estimate_plans_the_automatic_streams(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYFORMER_LLAMACPP_THREADS", "2")
    model = anyformer.describe(smollm2_path)
    request = anyformer.Request.build(context=2048, options={"parallel": "auto"})

    def planned(ram: int) -> int:
        verdict = can_run(model, anyformer.Caps(ram_bytes=ram), request)
        assert verdict.ok and verdict.estimate is not None
        return int(verdict.estimate.details["parallel"])

    one = can_run(model, anyformer.Caps(ram_bytes=16 * 2**30), anyformer.Request.build(context=2048))
    assert one.estimate is not None
    kv = kv_cache_bytes(dict(model.metadata["gguf"]), 2048, 0)
    assert planned(16 * 2**30) == 4  # 2 decode threads: 4 streams
    # Half the memory holds the model and two regions more: 3 streams, where parallel=4 would plan 4.
    assert planned(2 * (one.estimate.ram_bytes + 2 * kv + kv // 2)) == 3


def test_load_with_auto_serves_the_planned_streams(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYFORMER_LLAMACPP_THREADS", "1")
    with anyformer.load(smollm2_path, backend="llamacpp", context=256, options={"parallel": "auto"}) as loaded:
        assert loaded.parallel == 2  # 1 decode thread, memory to spare
