"""The lfm2 engine on random LFM2 GGUFs of several shapes, against float64 numpy and llama.cpp.

llama-cpp-python 0.3.36's llama.cpp reads the ``lfm2`` architecture, so it is the reference; the
float64 numpy forward (``numpy_reference_lfm2``, written from the architecture's definition)
separates the engine's own error from llama.cpp's. The tolerances are those of
``test_transformer.py``, for the same reasons:

- numpy: the engine sums in f32 (the convolution too), so it agrees to a few f32 ulps of the
  logits' scale: 3e-5 × scale + 1e-5 (measured 1.2e-6 to 1.2e-4 at logits of ±2.5 to ±160, at
  most 8e-7 of the scale).
- llama.cpp (``logits_all=True``, at every position of the prompt and of the 32 greedy tokens):
  its CPU build rounds activations to 8-bit blocks before quantised dot products (to f16 / bf16
  for F16 / BF16 weights) and keeps an f16 KV cache, so it is itself off the exact logits by a
  measured amount per model (on the prompt: 6e-4 for F32, 0.011 F16, 0.075 BF16, 0.059 Q4_K,
  0.88 Q8_0, 1.6 Q4_0, 6.8 Q6_K at logits of ±160). The engine must be within that amount (plus
  10 %) of llama.cpp, on top of its own f32 bound: its distance from llama.cpp is llama.cpp's
  distance from the exact logits.
- Greedy: every token is the exact argmax, and the 32 tokens are llama.cpp's. On the float-weight
  models they are identical. On quantised ones, where llama.cpp's rounding flips a near-tie (our
  token the exact argmax, its pick within twice its own error), one is allowed and printed, the
  issue's rule (measured: one each on the Q6_K and Q4_0 models, none on Q8_0 and Q4_K).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from numpy_reference_lfm2 import forward

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_gguf_gpu.decode import greedy, sampled
from anyformer_gguf_gpu.engines import engine_footprint, open_engine
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.lfm2 import Lfm2Engine
from anyformer_gguf_gpu.lfm2_config import read_lfm2_config
from anyformer_gguf_gpu.testing_lfm2 import RandomLfm2, write_random_lfm2_gguf

#: Random weights give flat logits; a larger weight ``scale`` spreads them, so that llama.cpp's
#: rounding flips fewer near-ties (K-quant blocks are random, and their models turn chaotic above
#: about 0.01: there a small scale keeps llama.cpp's error small instead).
MODELS = {
    "lfm2-gqa-tied-q8_0": RandomLfm2(scale=0.1),
    "lfm2-f32-untied-taps4": RandomLfm2(quant="F32", tied=False, l_cache=4, n_layer=3, attention_layers=(2,)),
    "lfm2-q4_k-attention-first": RandomLfm2(
        quant="Q4_K", n_embd=256, n_ff=512, n_head=8, n_kv=2, n_layer=5, attention_layers=(0, 3), scale=0.01
    ),
    "lfm2-f16-mha": RandomLfm2(quant="F16", n_kv=4, attention_layers=(2,)),
    "lfm2-bf16-taps2": RandomLfm2(quant="BF16", l_cache=2, n_head=2, n_kv=1, attention_layers=(0,)),
    "lfm2-q6_k-one-kv-head-untied": RandomLfm2(
        quant="Q6_K", n_embd=256, n_ff=512, n_kv=1, attention_layers=(1,), tied=False, scale=0.1
    ),
    "lfm2-q4_0-three-attention": RandomLfm2(quant="Q4_0", n_layer=6, attention_layers=(1, 2, 5), scale=0.2),
}
PROMPT = [5, 77, 100, 3, 250, 9, 1, 40, 41, 42, 7]
GREEDY = 32
#: Near-ties llama.cpp's rounding may flip in 32 greedy tokens (see the module docstring): none where
#: the weights are floats (llama.cpp then rounds activations to f16 at most), one where they are quantised.
FLOAT_TYPES = ("F32", "F16", "BF16")
MAX_NEAR_TIES = 1


@pytest.fixture(scope="module", params=list(MODELS), ids=list(MODELS))
def model_path(request, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("lfm2") / f"{request.param}.gguf"
    write_random_lfm2_gguf(str(path), MODELS[request.param], seed=len(request.param))
    return str(path)


@pytest.fixture(scope="module")
def engine(model_path, gpu):
    with GGUFFile(model_path) as gguf:
        # max_batch 4: the prompt runs as steps of 4, 4 and 3 tokens (the conv state crosses steps).
        # An f32 KV cache: the comparison with float64 holds the engine to f32 arithmetic.
        yield open_engine(gpu, gguf, ctx=64, max_batch=4, kv_f16=False)


@pytest.fixture(scope="module")
def llama(model_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=model_path, n_ctx=64, logits_all=True, verbose=False, n_threads=2)


def _bound(exact: np.ndarray) -> float:
    return 3e-5 * float(np.abs(exact).max()) + 1e-5


def test_the_registry_opens_the_lfm2_engine(engine):
    assert isinstance(engine, Lfm2Engine)
    c = engine.lfm2
    # Per conv layer 5 dispatches, per attention layer 5 (6 where heads are not a multiple of 4 wide:
    # rotary then runs apart from attention), plus head and argmax (which embeds the next id); prefill steps
    # too, with their embedding lookup.
    per_attention = 5 if c.head_dim % 4 == 0 else 6
    assert engine.dispatches_per_token == 5 * len(c.conv_layers) + per_attention * len(c.attention_layers) + 2
    assert len(engine.program(3, head=True)) == engine.dispatches_per_token + 1


def test_logits_match_float64_numpy(engine, model_path):
    exact = forward(model_path, PROMPT)
    ours = engine.all_logits(PROMPT)
    assert np.abs(ours - exact).max() <= _bound(exact)


def test_an_f16_kv_cache_stays_close_to_float64(model_path, gpu):
    """Where the adapter has shader-f16 the attention layers' cache holds f16 (llama.cpp's default)."""
    if not gpu.has_f16:
        pytest.skip("the adapter has no shader-f16")
    with GGUFFile(model_path) as gguf:
        f16 = open_engine(gpu, gguf, ctx=64, max_batch=4)
    assert f16.kernels.kv_f16
    exact = forward(model_path, PROMPT)
    assert np.abs(f16.all_logits(PROMPT) - exact).max() <= 3e-3 * float(np.abs(exact).max())
    f16.release()


@pytest.mark.parametrize(
    "spec",
    [
        RandomLfm2(n_layer=3, attention_layers=()),
        RandomLfm2(n_layer=2, attention_layers=(0, 1), quant="Q4_1"),
        RandomLfm2(quant="F16", conv_quant="F16"),
    ],
    ids=["convolutions-only", "attention-only", "f16-taps"],
)
def test_layer_mixes_llama_cpp_is_not_run_on_match_numpy(tmp_path, gpu, spec):
    """No attention layer, no convolution layer, and taps stored as F16 (llama.cpp's CPU convolution
    asserts F32 taps, so only numpy judges that one)."""
    path = str(tmp_path / "m.gguf")
    write_random_lfm2_gguf(path, spec, seed=5)
    with GGUFFile(path) as gguf:
        mixed = open_engine(gpu, gguf, ctx=32, max_batch=4, kv_f16=False)
    exact = forward(path, PROMPT)
    assert np.abs(mixed.all_logits(PROMPT) - exact).max() <= _bound(exact)
    mixed.release()


def test_one_token_steps_match_batched_steps(engine):
    """Decoding one token per step (KV cache and conv state filled step by step) gives the batched logits."""
    batched = engine.all_logits(PROMPT[:7])
    engine.set_ids(PROMPT[:7])
    for pos in range(7):
        engine.submit_step(pos, 1, head=True, sample=False)
        np.testing.assert_allclose(engine.read_logits()[0], batched[pos], rtol=0, atol=_bound(batched))


def test_a_new_sequence_forgets_the_last_one(engine):
    """Position 0 starts the convolution from zeros: a different earlier prompt changes nothing."""
    first = engine.all_logits(PROMPT)
    engine.all_logits([9, 8, 7, 6, 5, 4, 3, 2, 1])
    np.testing.assert_array_equal(engine.all_logits(PROMPT), first)


def test_greedy_and_every_step_match_llama_cpp(engine, model_path, llama):
    """32 greedy tokens from the GPU loop are llama.cpp's, and every step's logits are within its rounding."""
    ours = list(greedy(engine, PROMPT, GREEDY))
    assert len(ours) == GREEDY
    sequence = PROMPT + ours
    exact = forward(model_path, sequence)
    llama.reset()
    llama.eval(sequence)
    theirs = np.array(llama.scores[: len(sequence)])
    their_error = float(np.abs(theirs - exact).max())
    mine = engine.all_logits(sequence)
    assert np.abs(mine - exact).max() <= _bound(exact)
    assert np.abs(mine - theirs).max() <= 1.1 * their_error + _bound(exact)
    steps = range(len(PROMPT) - 1, len(sequence) - 1)
    near_ties = []
    for step, token in zip(steps, ours, strict=True):
        row = exact[step]
        assert row[token] >= row.max() - 2 * _bound(exact), f"step {step}: {token} is not the exact argmax"
        pick = int(theirs[step].argmax())
        if pick != token:
            gap = float(row[token] - row[pick])
            assert gap <= 2 * their_error, f"step {step}: llama.cpp picks {pick}, we pick {token} (exact gap {gap})"
            near_ties.append((step, token, pick, gap))
    allowed = 0 if MODELS[Path(model_path).stem].quant in FLOAT_TYPES else MAX_NEAR_TIES
    assert len(near_ties) <= allowed, f"too many near-ties flipped: {near_ties}"
    if near_ties:
        print(f"near-tie (step, ours, llama.cpp's, exact gap): {near_ties}")


def test_seeded_sampling_and_top_k_one_is_greedy(engine):
    greedy_ids = list(greedy(engine, PROMPT, 10))
    assert list(sampled(engine, PROMPT, 10, temperature=0.8, seed=3, top_k=1)) == greedy_ids
    first = list(sampled(engine, PROMPT, 10, temperature=1.5, seed=3, top_k=64, top_p=1.0))
    assert list(sampled(engine, PROMPT, 10, temperature=1.5, seed=3, top_k=64, top_p=1.0)) == first
    assert list(greedy(engine, PROMPT, 10)) == greedy_ids


def test_the_footprint_is_what_the_engine_allocates(model_path, engine):
    """gpu_bytes (the estimate's) counts the buffers the engine made: weights, attention-layer caches, states."""
    with GGUFFile(model_path) as gguf:
        summary = gguf.header.summary()
    plan = engine_footprint(summary, engine.ctx, engine.max_batch, kv_f16=False)
    assert engine.gpu_bytes == plan.gpu_bytes
    kv = sum(b.size for b in engine.k_cache + engine.v_cache)
    c = engine.lfm2
    assert plan.kv_bytes == 2 * len(c.attention_layers) * engine.ctx * c.kv_dim * 4 <= kv
    made = [engine.h, engine.qkv, engine.attn, engine.bcx, engine.gate_up, engine.logits, engine.scores]
    made += [engine.ids, engine.cos_sin, *engine.conv_state.values()]
    # Buffers round up to 16 bytes (and 4 bytes of read-ahead): the plan is within that of the sizes made.
    assert 0 <= sum(b.size for b in made) - plan.buffer_bytes <= 32 * len(made)


def _header(path: str):
    with GGUFFile(path) as gguf:
        return gguf.header


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"lfm2.attention.head_count_kv": [0, 2, 0, 4]}, "different KV head counts"),
        ({"lfm2.attention.head_count_kv": [0, 2, 0]}, "one count per layer"),
        ({"lfm2.shortconv.l_cache": 9}, "taps"),
        ({"lfm2.shortconv.l_cache": 4}, "shortconv.conv"),
        ({"lfm2.attention.sliding_window": 128}, "sliding-window"),
        ({"lfm2.attention.causal": False}, "non-causal"),
        ({"lfm2.attention.head_count": 8}, "heads of"),
        ({"lfm2.feed_forward_length": 100}, "ffn_gate"),
    ],
)
def test_a_header_that_does_not_fit_is_bad_model(tmp_path, change, words):
    path = str(tmp_path / "m.gguf")
    write_random_lfm2_gguf(path, RandomLfm2())
    header = _header(path)
    with pytest.raises(AnyformerError) as info:
        read_lfm2_config(dataclasses.replace(header, kv={**header.kv, **change}))
    assert info.value.code is ErrorCode.BAD_MODEL and words in str(info.value)


def test_attention_split_along_the_sequence_keeps_the_logits(tmp_path, gpu):
    """Past ``split_from`` keys the attention layers run as chunks of keys plus a combine: a 300-token
    prompt (two chunks) gives float64 numpy's logits at every position, and one-token steps past the edge."""
    path = str(tmp_path / "long.gguf")
    write_random_lfm2_gguf(path, RandomLfm2(quant="F32", n_ctx=512, attention_layers=(0, 2)), seed=5)
    prompt = [int(i) for i in np.random.default_rng(2).integers(1, 250, size=300)]
    with GGUFFile(path) as gguf:
        engine = open_engine(gpu, gguf, ctx=320, max_batch=64, kv_f16=False)
    engine.split_from = 100
    attention_layers = len(engine.lfm2.attention_layers)
    split = engine.program(1, head=True, split=True, chained=True)
    assert len(split) == engine.dispatches_per_token + attention_layers
    exact = forward(path, prompt)
    assert np.abs(engine.all_logits(prompt) - exact).max() <= _bound(exact)
    # One-token steps replay positions 256.. after the prompt: the conv state must start where it was.
    engine.all_logits(prompt[:256])
    for pos in (256, 257):
        engine.submit_step(pos, 1, head=True, sample=False)
        np.testing.assert_allclose(engine.read_logits()[0], exact[pos], rtol=0, atol=_bound(exact))
    engine.release()
