"""The llama-family engine on random GGUFs of several shapes, against float64 numpy and llama.cpp.

Two yardsticks, two tolerances:

- numpy (``numpy_reference.forward``): the same dequantised weights in float64. The engine sums in
  f32, so it must agree to a few f32 ulps of the logits' scale (measured ≤ 4e-5 absolute at
  logits of ±5..30; the bound here is 3e-5 × scale + 1e-5, far below what any wiring bug gives).
- llama.cpp (llama-cpp-python, ``logits_all=True``): its CPU build rounds the activations to 8-bit
  blocks before quantised dot products, so its own distance from the exact logits is the
  tolerance: the engine must be within that distance (measured per model, plus 10%) of llama.cpp.
  Greedy tokens must each be the exact argmax, and llama.cpp's pick except where its rounding flips
  a near-tie. Random weights give flat logits (the top two of a few hundred random scores are close),
  so such flips are likelier than in a trained model: up to three in 32 tokens are allowed here and
  printed, each one checked to be within llama.cpp's own error; the real SmolLM2 allows one
  (test_smollm2.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from numpy_reference import forward

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_gguf_gpu import kernels as kernels_module
from anyformer_gguf_gpu.decode import greedy
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.testing import RandomModel, write_random_gguf
from anyformer_gguf_gpu.transformer import TransformerEngine

MODELS = {
    "llama-gqa-tied-q8_0": RandomModel(),
    "llama-q4_1-mha": RandomModel(quant="Q4_1", n_kv=4),
    "llama-headdim24-untied-q4_0": RandomModel(quant="Q4_0", head_dim=24, tied=False),
    "llama-q4_k": RandomModel(quant="Q4_K", n_embd=256, n_ff=512, head_dim=64),
    "llama-q5_k-untied": RandomModel(quant="Q5_K", n_embd=256, n_ff=512, head_dim=64, tied=False),
    "llama-bf16": RandomModel(quant="BF16", n_head=2, n_kv=1, head_dim=48),
    "qwen3-f16-one-kv-head": RandomModel(architecture="qwen3", quant="F16", n_kv=1),
    "qwen3-q6_k": RandomModel(architecture="qwen3", quant="Q6_K", n_embd=256, n_ff=512, head_dim=64),
    "qwen3-f32-untied": RandomModel(architecture="qwen3", quant="F32", tied=False, head_dim=8, n_head=8, n_kv=4),
}
#: Near-ties llama.cpp's rounding may flip in 32 greedy tokens of a random model (see the module docstring).
MAX_RANDOM_NEAR_TIES = 3
PROMPT = [5, 77, 100, 3, 250, 9, 1, 40, 41, 42, 7]


@pytest.fixture(scope="module", params=list(MODELS), ids=list(MODELS))
def model_path(request, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("models") / f"{request.param}.gguf"
    write_random_gguf(str(path), MODELS[request.param], seed=len(request.param))
    return str(path)


@pytest.fixture(scope="module")
def engine(model_path, gpu):
    with GGUFFile(model_path) as gguf:
        # max_batch 4: the 11-token prompt runs as steps of 4, 4 and 3 tokens.
        # An f32 KV cache: the exact comparisons below hold the engine to f32 arithmetic.
        yield TransformerEngine(gpu, gguf, ctx=64, max_batch=4, kv_f16=False)


def _bound(exact: np.ndarray) -> float:
    return 3e-5 * float(np.abs(exact).max()) + 1e-5


def test_logits_match_float64_numpy(engine, model_path):
    exact = forward(model_path, PROMPT)
    ours = engine.all_logits(PROMPT)
    assert np.abs(ours - exact).max() <= _bound(exact)


def test_an_f16_kv_cache_stays_close_to_float64(model_path, gpu):
    """Where the adapter has shader-f16 the cache holds f16 (as llama.cpp's default): 11 bits of mantissa."""
    if not gpu.has_f16:
        pytest.skip("the adapter has no shader-f16")
    with GGUFFile(model_path) as gguf:
        engine = TransformerEngine(gpu, gguf, ctx=64, max_batch=4)
    assert engine.kernels.kv_f16
    exact = forward(model_path, PROMPT)
    assert np.abs(engine.all_logits(PROMPT) - exact).max() <= 3e-3 * float(np.abs(exact).max())
    engine.release()


def test_one_token_steps_match_batched_steps(engine):
    """Decoding one token per step (the KV cache filled step by step) gives the batched logits."""
    batched = engine.all_logits(PROMPT[:6])
    engine.set_ids(PROMPT[:6])
    for pos in range(6):
        engine.submit_step(pos, 1, head=True, sample=False)
        np.testing.assert_allclose(engine.read_logits()[0], batched[pos], rtol=0, atol=_bound(batched))


@pytest.mark.parametrize("name", ["llama-q4_1-mha", "qwen3-q6_k"])
def test_one_token_steps_in_a_gpus_matrix_layouts_match_float64_numpy(name, tmp_path, gpu, monkeypatch):
    """On a GPU one-token products take a shape per matrix (kernels.decode_layout; lavapipe keeps one thread a
    row): forced here, with a vocabulary wide enough for the head's own layout, every step's logits stay exact."""
    monkeypatch.setattr(kernels_module, "default_threads_per_row", lambda gpu: 32)
    path = str(tmp_path / f"{name}.gguf")
    write_random_gguf(path, dataclasses.replace(MODELS[name], n_vocab=kernels_module.WIDE_ROWS + 17), seed=3)
    with GGUFFile(path) as gguf:
        engine = TransformerEngine(gpu, gguf, ctx=64, max_batch=4, kv_f16=False)
    assert engine.kernels.layout_per_matrix
    exact = forward(path, PROMPT[:6])
    # Steps of several tokens too: the head over every token is wide enough for the tiled kernel's own layout.
    assert np.abs(engine.all_logits(PROMPT[:6]) - exact).max() <= _bound(exact)
    engine.set_ids(PROMPT[:6])
    for pos in range(6):
        engine.submit_step(pos, 1, head=True, sample=False)
        np.testing.assert_allclose(engine.read_logits()[0], exact[pos], rtol=0, atol=_bound(exact))
    engine.release()


def test_logits_match_llama_cpp_within_its_own_rounding(engine, model_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=64, logits_all=True, verbose=False, n_threads=2)
    llm.eval(PROMPT)
    theirs = np.array(llm.scores[: len(PROMPT)])
    exact = forward(model_path, PROMPT)
    their_error = float(np.abs(theirs - exact).max())
    ours = engine.all_logits(PROMPT)
    assert np.abs(ours - theirs).max() <= 1.1 * their_error + _bound(exact)


def test_greedy_matches_llama_cpp(engine, model_path):
    """32 greedy tokens from the GPU loop: the exact argmax each step, and llama.cpp's but for near-ties."""
    llama_cpp = pytest.importorskip("llama_cpp")
    ours = list(greedy(engine, PROMPT, 32))
    assert len(ours) == 32
    exact = forward(model_path, PROMPT + ours)[len(PROMPT) - 1 : -1]
    for step, (token, row) in enumerate(zip(ours, exact, strict=True)):
        assert row[token] >= row.max() - 2 * _bound(exact), f"step {step}: {token} is not the argmax"
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=64, logits_all=True, verbose=False, n_threads=2)
    llm.eval(PROMPT + ours)
    theirs = np.array(llm.scores[len(PROMPT) - 1 : len(PROMPT) + 31])
    their_error = float(np.abs(theirs - exact).max())
    near_ties = []
    for step, (token, row) in enumerate(zip(ours, theirs, strict=True)):
        pick = int(row.argmax())
        if pick != token:
            gap = float(exact[step][token] - exact[step][pick])
            assert gap <= 2 * their_error, f"step {step}: llama.cpp picks {pick}, we pick {token} (exact gap {gap})"
            near_ties.append((step, token, pick, gap))
    assert len(near_ties) <= MAX_RANDOM_NEAR_TIES, f"too many near-ties flipped: {near_ties}"
    if near_ties:
        print(f"near-tie (step, ours, llama.cpp's, exact gap): {near_ties}")


def test_several_steps_in_one_submission_decode_the_same_ids(engine, monkeypatch):
    """STEPS decode steps share a submission (each its own pass and position): the same ids as one per submission."""
    from anyformer_gguf_gpu import decode

    monkeypatch.setattr(decode, "STEPS", 1)
    one_by_one = list(greedy(engine, PROMPT, 11))
    for steps in (3, 4, 16):
        monkeypatch.setattr(decode, "STEPS", steps)
        assert list(greedy(engine, PROMPT, 11)) == one_by_one
    stream = greedy(engine, PROMPT, 11)
    assert [next(stream) for _ in range(5)] == one_by_one[:5]
    stream.close()  # left with submissions in flight: their maps are settled, the engine stays usable
    assert list(greedy(engine, PROMPT, 11)) == one_by_one


def test_a_decode_step_is_five_dispatches_a_layer(engine):
    """Rotary and the KV store ride in the q/k/v projection (llama) or in attention (qwen3, heads a multiple of 4),
    in decode and prefill steps alike."""
    c = engine.config
    per_layer = 5 if engine.rope_in_projection or c.head_dim % 4 == 0 else 6
    # + output head and argmax: the argmax also embeds the next id, so a decode step has no embedding lookup.
    assert engine.dispatches_per_token == per_layer * c.n_layer + 2
    assert len(engine.program(3, head=True)) == per_layer * c.n_layer + 3  # + the prompt's embedding lookup


def test_a_decode_step_embeds_its_id_itself_unless_the_step_before_did(engine):
    """Decode steps take their input from the previous step's sampler; a submission after anything else
    (here the prompt run without sampling, the next id written by the host) looks its first id up."""
    want = list(greedy(engine, PROMPT, 5))
    engine.all_logits(PROMPT)  # steps without a sampler: the residual holds the last layer's output
    q = len(PROMPT)
    engine.set_ids([want[0]], start=q)
    engine.submit_decode(q, 4)
    assert [engine.read_id(p) for p in range(q + 1, q + 5)] == want[1:]


def test_native_encoding_gives_what_the_public_api_gives(engine):
    """Dispatches encoded through wgpu-native's functions directly: the same logits and ids as through wgpu-py's API."""
    kernels = engine.kernels
    if kernels.native_calls is None:
        pytest.skip("wgpu-py's native backend functions are not reachable here")
    native = (engine.all_logits(PROMPT[:5]), list(greedy(engine, PROMPT, 6)))
    calls, kernels.native_calls = kernels.native_calls, None
    try:
        public = (engine.all_logits(PROMPT[:5]), list(greedy(engine, PROMPT, 6)))
    finally:
        kernels.native_calls = calls
    np.testing.assert_array_equal(native[0], public[0])
    assert native[1] == public[1]


def test_a_wrong_binding_encoded_natively_is_an_error_not_a_log_line(engine):
    """The native encoder calls wgpu-native's functions without wgpu-py's per-call error capture (one capture
    covers the pass; wgpu-native may also report at the pass's end): a bind group that does not fit its
    pipeline still fails the run as a BACKEND_CRASHED error rather than a logged line, and the engine runs on."""
    kernels = engine.kernels
    if kernels.native_calls is None:
        pytest.skip("wgpu-py's native backend functions are not reachable here")
    step = engine.program(1, head=True, sample=False)
    matvec = next(d for d in step if d.name == "matvec")
    other = next(d for d in step if d.pipeline is not matvec.pipeline and d.name != "embed")
    wrong = dataclasses.replace(matvec, bind_group=other.bind_group)
    assert wrong.native is not None and wrong.native[1] is other.native[1]  # encoded natively, with the wrong group
    with pytest.raises(AnyformerError) as caught:
        kernels.run([wrong])
    assert caught.value.code == ErrorCode.BACKEND_CRASHED
    assert len(list(greedy(engine, PROMPT, 3))) == 3


def test_sampling_on_the_gpu_is_seeded_and_top_k_one_is_greedy(engine):
    from anyformer_gguf_gpu.decode import sampled

    greedy_ids = list(greedy(engine, PROMPT, 12))
    assert list(sampled(engine, PROMPT, 12, temperature=0.8, seed=3, top_k=1)) == greedy_ids
    first = list(sampled(engine, PROMPT, 12, temperature=1.5, seed=3, top_k=64, top_p=1.0))
    assert list(sampled(engine, PROMPT, 12, temperature=1.5, seed=3, top_k=64, top_p=1.0)) == first
    assert list(sampled(engine, PROMPT, 12, temperature=1.5, seed=4, top_k=64, top_p=1.0)) != first
    assert list(greedy(engine, PROMPT, 12)) == greedy_ids  # greedy again after sampling


def test_different_shapes_give_a_shape_error_not_garbage(tmp_path, gpu):
    """A header whose dims disagree with its tensors is BAD_MODEL at load."""
    from anyformer.plugin import AnyformerError, ErrorCode

    path = tmp_path / "bad.gguf"
    spec = dataclasses.replace(MODELS["llama-gqa-tied-q8_0"])
    write_random_gguf(str(path), spec)
    data = path.read_bytes()
    key = b"llama.feed_forward_length"
    at = data.index(key) + len(key) + 4  # the value follows the key and its 4-byte type
    path.write_bytes(data[:at] + (200).to_bytes(4, "little") + data[at + 4 :])
    with GGUFFile(path) as gguf, pytest.raises(AnyformerError) as info:
        TransformerEngine(gpu, gguf, ctx=16)
    assert info.value.code is ErrorCode.BAD_MODEL and "ffn_gate" in str(info.value)


#: Long-context models for the split attention: 300 positions are two chunks of ATTENTION_CHUNK keys.
LONG = {
    "llama-gqa-tied-q8_0": RandomModel(n_ctx=512),
    "qwen3-f16-one-kv-head": RandomModel(architecture="qwen3", quant="F16", n_kv=1, n_ctx=512),
    "llama-headdim10-f32": RandomModel(quant="F32", head_dim=10, n_ctx=512),
}


@pytest.mark.parametrize("name", list(LONG))
def test_attention_split_along_the_sequence_keeps_the_logits(tmp_path, gpu, name):
    """Past ``split_from`` keys every attention layer runs as chunks of keys plus a combine dispatch.

    A 300-token prompt (steps past 100 keys split; the last ones span two chunks) gives float64
    numpy's logits at every position, one-token decode steps past the chunk edge too (qwen3's rotate
    inside attention, head width 10 takes the scalar kernel), and llama.cpp's within its own rounding.
    """
    path = str(tmp_path / f"{name}.gguf")
    write_random_gguf(path, LONG[name], seed=3)
    prompt = [int(i) for i in np.random.default_rng(1).integers(1, 250, size=300)]
    with GGUFFile(path) as gguf:
        engine = TransformerEngine(gpu, gguf, ctx=320, max_batch=64, kv_f16=False)
    engine.split_from = 100
    n_layer = engine.config.n_layer
    assert len(engine.program(1, head=True, split=True, chained=True)) == engine.dispatches_per_token + n_layer
    exact = forward(path, prompt)
    ours = engine.all_logits(prompt)
    assert np.abs(ours - exact).max() <= _bound(exact)
    for pos in (255, 256, 299):  # the first key of the second chunk, and the last position
        engine.submit_step(pos, 1, head=True, sample=False)
        np.testing.assert_allclose(engine.read_logits()[0], exact[pos], rtol=0, atol=_bound(exact))
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=path, n_ctx=320, n_batch=320, logits_all=True, verbose=False, n_threads=2)
    llm.eval(prompt)
    theirs = np.array(llm.scores[: len(prompt)])
    their_error = float(np.abs(theirs - exact).max())
    assert np.abs(ours - theirs).max() <= 1.1 * their_error + _bound(exact)
    engine.release()
