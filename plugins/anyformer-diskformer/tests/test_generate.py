"""load and generate under the contract: the reply's text is llama.cpp's greedy text, token for token."""

from __future__ import annotations

import numpy as np
import pytest
from diskformer_reference import open_or_skip
from llama_cpp import Llama

import anyformer
from anyformer import AnyformerError, ErrorCode, GenerateOptions, Request
from anyformer.plugin import read_gguf_header, render_chat
from anyformer_diskformer.model import DiskformerModel
from anyformer_diskformer.plan import plan_from_header

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the sea is"}]
TOKENS = 32


def open_model(path: str, **options: object) -> DiskformerModel:
    return DiskformerModel.open(anyformer.describe(path), Request(context=128, options=options), lambda event: None)


def llama_greedy(path: str, ids: list[int]) -> str:
    """llama.cpp's greedy reply to ``ids`` (f32 KV cache), up to ``TOKENS`` tokens or its end of sequence."""
    llm = Llama(path, n_ctx=128, logits_all=True, type_k=0, type_v=0, verbose=False)
    llm.eval(ids)
    out: list[int] = []
    while len(out) < TOKENS:
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        if token == llm.token_eos():
            break
        out.append(token)
        llm.eval([token])
    text = llm.detokenize(out).decode("utf-8", errors="replace")
    llm.close()
    return text


@pytest.mark.parametrize("device", ["cpu", "gpu"])
@pytest.mark.parametrize("evicting", [False, True])
def test_greedy_reply_is_llama_cpps(moe_f32, evicting, device):
    plan = plan_from_header(read_gguf_header(moe_f32), 128, device)
    options: dict[str, object] = {"device": device}
    if evicting:
        options["pool_bytes"] = plan.min_cache_bytes
    model = open_or_skip(moe_f32, 128, **options)
    try:
        ids = model.prompt_ids(MESSAGES, thinking=False)
        prompt = render_chat(model.tokenizer.chat_template, MESSAGES)
        llm = Llama(moe_f32, n_ctx=128, verbose=False, vocab_only=True)
        assert llm.tokenize(prompt.encode(), add_bos=False, special=True) == ids
        llm.close()
        chunks = list(model.generate(MESSAGES, GenerateOptions(max_new_tokens=TOKENS)))
        assert "".join(c.delta for c in chunks) == llama_greedy(moe_f32, ids)
        assert chunks[0].prompt_tokens == len(ids) and chunks[-1].finish_reason in ("stop", "length")
        stats = model.cache_stats
        assert stats is not None and stats.misses > 0
        assert (stats.evictions > 0) == evicting
    finally:
        model.dispose()
        model.dispose()
    assert model.cache_stats is None


def test_a_pool_below_one_layers_top_k_is_budget_too_small_with_the_need(moe_f32):
    plan = plan_from_header(read_gguf_header(moe_f32), 128)
    with pytest.raises(AnyformerError) as caught:
        open_model(moe_f32, pool_bytes=plan.min_cache_bytes - 1, device="cpu")
    assert caught.value.code is ErrorCode.BUDGET_TOO_SMALL
    assert caught.value.need == plan.need


def test_a_pool_that_is_not_a_positive_integer_is_a_bad_request(moe_f32):
    with pytest.raises(AnyformerError) as caught:
        open_model(moe_f32, pool_bytes="lots", device="cpu")
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_an_unknown_device_is_a_bad_request(moe_f32):
    with pytest.raises(AnyformerError) as caught:
        open_model(moe_f32, device="tpu")
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_the_core_loads_it_through_the_entry_point(moe_folder):
    with anyformer.load(moe_folder, backend="diskformer", context=128) as loaded:
        reply = loaded.complete(MESSAGES, max_new_tokens=4)
    assert reply.tokens > 0 or reply.finish_reason == "stop"


def test_sampling_draws_only_within_top_k_and_top_p_and_repeats_with_the_seed():
    from anyformer_diskformer.sampler import sample

    logits = np.array([0.0, 5.0, 4.0, 1.0, 4.5, -2.0], dtype=np.float32)
    draws = [sample(logits, 1.0, 3, 1.0, np.random.default_rng(s)) for s in range(200)]
    assert set(draws) == {1, 2, 4}  # the three largest, each drawn at some seed
    assert all(sample(logits, 1.0, 1, 1.0, np.random.default_rng(s)) == 1 for s in range(20))
    # top_p 0.5: the largest alone holds ~51 % of the top-3 mass, so it is all that is kept.
    assert {sample(logits, 1.0, 3, 0.5, np.random.default_rng(s)) for s in range(50)} == {1}
    first = [sample(logits, 0.8, 6, 0.95, np.random.default_rng(7)) for _ in range(5)]
    assert len(set(first)) == 1
    # top_k 0 keeps every token (no top-k), not only the likeliest.
    assert len({sample(logits, 3.0, 0, 1.0, np.random.default_rng(s)) for s in range(300)}) >= 5


def test_a_seeded_sampled_reply_repeats(moe_f32):
    model = open_model(moe_f32)
    try:
        options = {"max_new_tokens": 12, "temperature": 0.9, "seed": 5}
        one = "".join(c.delta for c in model.generate(MESSAGES, GenerateOptions(**options)))
        two = "".join(c.delta for c in model.generate(MESSAGES, GenerateOptions(**options)))
        greedy = "".join(c.delta for c in model.generate(MESSAGES, GenerateOptions(max_new_tokens=12)))
    finally:
        model.dispose()
    assert one == two and one != greedy


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_qwen35moe_replies_as_llama_cpp(qwen35moe_f32, device):
    from anyformer_diskformer.engines.cpu.qwen35moe import HybridCpuEngine
    from anyformer_diskformer.engines.gpu.qwen35moe import HybridGpuEngine

    model = open_or_skip(qwen35moe_f32, 128, device=device)
    try:
        engine = model.engine
        assert isinstance(engine, HybridGpuEngine if device == "gpu" else HybridCpuEngine)
        # KV rows for the one attention layer only (the three delta nets keep states): 2 x 128 positions x 32 floats.
        kv_bytes = 2 * 128 * engine.config.kv_dim * 4
        if isinstance(engine, HybridGpuEngine):
            assert [b is not None for b in engine.k_cache] == [False, False, False, True]
            held = sum(int(b.size) for b in engine._kv_buffers())
            assert kv_bytes <= held <= kv_bytes + 2 * 32  # GPU buffers are padded to 16 bytes past a spare word
        else:
            assert engine._k.nbytes + engine._v.nbytes == kv_bytes
        ids = model.prompt_ids(MESSAGES, thinking=False)
        text = "".join(c.delta for c in model.generate(MESSAGES, GenerateOptions(max_new_tokens=TOKENS)))
        assert text == llama_greedy(qwen35moe_f32, ids)
        # A second reply starts over: the delta nets' states do not carry the first conversation.
        again = "".join(c.delta for c in model.generate(MESSAGES, GenerateOptions(max_new_tokens=TOKENS)))
        assert again == text
    finally:
        model.dispose()
