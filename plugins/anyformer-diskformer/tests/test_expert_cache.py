"""The expert cache reads the right bytes, keeps within its budget and evicts the least recently used."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from anyformer import AnyformerError, ErrorCode
from anyformer.plugin import read_gguf_header
from anyformer_diskformer.cache.expert_cache import ExpertCache


def open_cache(path: str, experts_held: float) -> ExpertCache:
    header = read_gguf_header(path)
    probe = ExpertCache(path, header, 2, 8, 10**9)
    one = probe.expert_bytes
    probe.close()
    return ExpertCache(path, header, 2, 8, int(one * experts_held))


def test_every_expert_is_the_slab_gguf_reader_sees(moe_f32):
    reader = gguf.GGUFReader(moe_f32)
    tensors = {t.name: t for t in reader.tensors}
    with open_cache(moe_f32, 100) as cache:
        for layer in range(2):
            for expert in range(8):
                got = cache.get(layer, expert)
                for kind, raw in (("gate", got.gate), ("up", got.up), ("down", got.down)):
                    want = np.asarray(tensors[f"blk.{layer}.ffn_{kind}_exps.weight"].data[expert])
                    np.testing.assert_array_equal(raw.view(np.float32), want.reshape(-1))
        assert cache.stats.misses == 16 and cache.stats.hits == 0 and cache.stats.evictions == 0
        assert cache.stats.bytes_read == 16 * cache.expert_bytes == cache.held_bytes


@pytest.mark.parametrize("fixture", ["gemma4_dense_layer", "qwen35moe_alternating"])
def test_a_fused_gate_up_tensor_gives_each_expert_its_gate_and_up_halves(request, fixture):
    """``ffn_gate_up_exps`` (rows 2 n_ff, gate's first, as llama.cpp splits it): an expert's gate slab is its first
    n_ff rows, its up slab the next n_ff, read as two slabs of half the expert's stride."""
    from anyformer_diskformer.cache.expert_reader import ExpertReader, expert_spans

    path = request.getfixturevalue(fixture)
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    header = read_gguf_header(path)
    n_expert = int(reader.fields[f"{reader.fields['general.architecture'].contents()}.expert_count"].contents())
    moe_layers = [i for i in range(4) if f"blk.{i}.ffn_gate_up_exps.weight" in tensors]
    assert moe_layers and not any(name.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight")) for name in tensors)
    spans = expert_spans(header, 4, n_expert)
    experts = ExpertReader(path, spans)
    try:
        for layer in moe_layers:
            fused = np.asarray(tensors[f"blk.{layer}.ffn_gate_up_exps.weight"].data)  # (experts, 2 n_ff, n_embd)
            half = fused.shape[1] // 2
            gate, up = spans[layer, "ffn_gate_exps"], spans[layer, "ffn_up_exps"]
            assert gate.length == up.length == gate.stride // 2 and up.offset == gate.offset + gate.length
            for expert in (0, n_expert - 1):
                got = experts.read(layer, expert)
                np.testing.assert_array_equal(got.gate.view(np.float32), fused[expert, :half].reshape(-1))
                np.testing.assert_array_equal(got.up.view(np.float32), fused[expert, half:].reshape(-1))
                down = np.asarray(tensors[f"blk.{layer}.ffn_down_exps.weight"].data[expert])
                np.testing.assert_array_equal(got.down.view(np.float32), down.reshape(-1))
    finally:
        experts.close()


def test_least_recently_used_goes_first(moe_f32):
    with open_cache(moe_f32, 2.5) as cache:
        cache.get(0, 1)
        cache.get(0, 2)
        cache.get(0, 1)  # 1 is now the most recent
        cache.get(1, 3)  # evicts 2
        assert (0, 1) in cache and (1, 3) in cache and (0, 2) not in cache
        assert (cache.stats.hits, cache.stats.misses, cache.stats.evictions) == (1, 3, 1)
        assert cache.held_bytes == 2 * cache.expert_bytes <= cache.capacity_bytes


def test_hits_match_an_lru_model_on_a_random_trace(moe_f32):
    rng = np.random.default_rng(3)
    trace = [(int(layer), int(expert)) for layer, expert in rng.integers(0, [2, 8], size=(300, 2))]
    slots = 5
    with open_cache(moe_f32, slots) as cache:
        model: list[tuple[int, int]] = []
        hits = 0
        for key in trace:
            if key in model:
                hits += 1
                model.remove(key)
            elif len(model) == slots:
                model.pop(0)
            model.append(key)
            cache.get(*key)
            assert cache.held_bytes <= cache.capacity_bytes
        assert cache.stats.hits == hits and cache.stats.misses == len(trace) - hits
        assert cache.stats.bytes_read == cache.stats.misses * cache.expert_bytes
        assert 0 < cache.stats.hit_rate < 1


def test_a_cache_smaller_than_one_expert_is_budget_too_small_with_the_need(moe_f32):
    header = read_gguf_header(moe_f32)
    with pytest.raises(AnyformerError) as caught:
        ExpertCache(moe_f32, header, 2, 8, 1000)
    assert caught.value.code is ErrorCode.BUDGET_TOO_SMALL
    # gate and up are 32 × 64 f32, down 64 × 32: three slabs of 8 KiB.
    assert caught.value.need == 3 * 32 * 64 * 4


def test_bad_keys_and_a_closed_cache_are_bad_requests(moe_f32):
    cache = open_cache(moe_f32, 4)
    with pytest.raises(AnyformerError) as caught:
        cache.get(2, 0)
    assert caught.value.code is ErrorCode.BAD_REQUEST
    cache.close()
    cache.close()
    with pytest.raises(AnyformerError) as caught:
        cache.get(0, 0)
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_a_header_whose_expert_count_disagrees_is_bad_model(moe_f32):
    with pytest.raises(AnyformerError) as caught:
        ExpertCache(moe_f32, read_gguf_header(moe_f32), 2, 16, 10**9)
    assert caught.value.code is ErrorCode.BAD_MODEL


def test_the_o_direct_reader_reads_the_same_bytes_or_says_why_not(moe_top4):
    from anyformer_diskformer.cache.expert_reader import ExpertReader, expert_spans, open_reader

    header = read_gguf_header(moe_top4)
    spans = expert_spans(header, 3, 16)
    direct = open_reader(moe_top4, spans)
    plain = ExpertReader(moe_top4, spans)
    try:
        assert direct.method == "O_DIRECT" or direct.note.startswith("pread+fadvise: ")
        for layer, expert in ((0, 0), (1, 7), (2, 15)):
            a, b = direct.read(layer, expert), plain.read(layer, expert)
            for x, y in ((a.gate, b.gate), (a.up, b.up), (a.down, b.down)):
                np.testing.assert_array_equal(x, y)
            assert a.types == b.types
    finally:
        direct.close()
        plain.close()
    assert open_reader(moe_top4, spans, direct=False).method == "pread+fadvise"


def test_a_layers_misses_are_read_side_by_side_and_still_count_as_misses(moe_f32):
    import threading

    from anyformer_diskformer.cache.prefetch import Prefetcher

    reader = gguf.GGUFReader(moe_f32)
    want = {t.name: t for t in reader.tensors}
    with open_cache(moe_f32, 100) as cache:
        cache.get(0, 1)  # held: a hit, handed out first
        read_by: dict[int, str] = {}
        plain_read = cache.reader.read

        def recording_read(layer: int, expert: int):
            read_by[expert] = threading.current_thread().name
            return plain_read(layer, expert)

        cache.reader.read = recording_read  # type: ignore[method-assign]
        cache.prefetcher = Prefetcher(cache.reader, cache.stats, width=2, threads=2)
        got = dict(cache.fetch_each(0, [5, 1, 2, 3, 4], pin=False, read_ahead=True))
        for expert, slabs in got.items():
            data = np.asarray(want["blk.0.ffn_gate_exps.weight"].data[expert]).reshape(-1)
            np.testing.assert_array_equal(slabs.gate.view(np.float32), data)
        # The first miss is read here; the reader threads read the next ones meanwhile.
        assert read_by[5] == threading.current_thread().name
        assert all(read_by[e].startswith("diskformer-prefetch") for e in (2, 3, 4))
        # Five misses (expert 1's first lookup and these four), none counted as prefetched.
        assert (cache.stats.hits, cache.stats.misses, cache.stats.prefetched) == (1, 5, 0)
        assert cache.stats.bytes_read == 5 * cache.expert_bytes and cache.stats.prefetch_wasted == 0
