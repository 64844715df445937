"""The CPU engine on several threads: the same logits as on one, and the threads option checked."""

from __future__ import annotations

import numpy as np
import pytest

import anyformer
from anyformer import AnyformerError, ErrorCode, Request
from anyformer.plugin import read_gguf_header
from anyformer_diskformer.compute import expert_compute
from anyformer_diskformer.model import DiskformerModel
from anyformer_diskformer.plan import plan_from_header
from anyformer_diskformer.testing import TinyMoE, write_tiny_moe

PROMPT = [1, 60, 75, 82, 90, 101]


def greedy(path: str, steps: int, **options: object) -> tuple[np.ndarray, list[int]]:
    """Every step's last logits for the prompt and ``steps`` greedy tokens, and those tokens."""
    model = DiskformerModel.open(anyformer.describe(path), Request(context=64, options=options), lambda e: None)
    try:
        engine = model.engine
        assert engine is not None
        rows = [engine.forward(PROMPT, 0)[-1]]
        tokens: list[int] = []
        for step in range(steps):
            tokens.append(int(np.argmax(rows[-1])))
            rows.append(engine.forward([tokens[-1]], len(PROMPT) + step)[-1])
    finally:
        model.dispose()
    return np.stack(rows), tokens


@pytest.fixture(scope="module")
def q4k_moe(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer qwen3moe with Q8_0 dense weights and Q4_K experts (the grouped products' formats)."""
    path = str(tmp_path_factory.mktemp("moe") / "tiny-qwen3moe-q4k.gguf")
    write_tiny_moe(path, TinyMoE(n_embd=256, n_ff_exp=256, quant="Q8_0", expert_quant="Q4_K"), seed=6)
    return path


def test_threads_give_the_logits_of_one_thread(q4k_moe, monkeypatch):
    # Every dense matrix split over the threads, and a cache of one layer's top-k so experts are evicted while
    # the threads still compute with them (the prompt routes to more experts than the cache holds).
    monkeypatch.setattr(expert_compute, "PARALLEL_ELEMENTS", 1)
    pool = plan_from_header(read_gguf_header(q4k_moe), 64, "cpu").min_cache_bytes
    one, tokens_one = greedy(q4k_moe, 8, device="cpu", threads=1, pool_bytes=pool, prefetch=0)
    three, tokens_three = greedy(q4k_moe, 8, device="cpu", threads=3, pool_bytes=pool, prefetch=0)
    assert tokens_three == tokens_one
    np.testing.assert_allclose(three, one, rtol=1e-5, atol=1e-5 * np.abs(one).max())


@pytest.mark.parametrize("threads", [0, -1, "2", True, 1.5])
def test_threads_must_be_a_positive_whole_number(q4k_moe, threads):
    with pytest.raises(AnyformerError) as caught:
        greedy(q4k_moe, 0, device="cpu", threads=threads)
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert "threads" in str(caught.value)


@pytest.mark.parametrize("threads", [2, 8, 16])  # a thread an expert; rows in 2 and 5 parts
def test_weighted_sum_split_over_more_threads_than_experts_is_the_one_thread_sum(q4k_moe, threads):
    """weighted_sum (the GPU engine's cpu_experts): each expert on a thread of its own, or its matrices' rows in
    parts where the threads outnumber the experts, gives the one-thread sum of expert_ffn's outputs."""
    from anyformer_diskformer.arch.registry import read_moe_config
    from anyformer_diskformer.cache.expert_reader import ExpertReader, expert_spans
    from anyformer_diskformer.compute.quant_product import QuantProduct, expert_ffn

    header = read_gguf_header(q4k_moe)
    config = read_moe_config(header)
    reader = ExpertReader(q4k_moe, expert_spans(header, config.n_layer, config.n_expert))
    x = np.random.default_rng(3).standard_normal(config.n_embd).astype(np.float32)
    experts, weights = [5, 1, 3], [0.5, 0.3, 0.2]
    want = np.zeros(config.n_embd, dtype=np.float32)
    for e, w in zip(experts, weights, strict=True):
        y = expert_ffn(QuantProduct(), reader.read(1, e), x[None, :], config.n_embd, config.n_ff_exp)[0]
        want += np.float32(w) * y
    runner = expert_compute.ExpertRunner(threads, config.n_embd, config.n_ff_exp)
    try:
        got, loaded = runner.weighted_sum(lambda e: reader.read(1, e), experts, weights, x)
    finally:
        runner.close()
        reader.close()
    assert len(loaded) == 3
    np.testing.assert_array_equal(got, want)  # each row is the whole row's product, summed in the same order
