"""The kernel variants Gemma 4's MoE needs on wgpu, against numpy on random data (lavapipe in CI).

GELU-gated inputs of the matrix kernel, a scaled embedding lookup, RMSNorm added to a residual and
scaled, v heads normalised without a weight, and sliding-window attention (whole and split along the
sequence). Shapes are small and odd, as in test_kernels; tolerances likewise a few f32 ulps of the
largest partial sums.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_kernels import _cache, _close, _read_cache, _rms, _state, cos_sin_table, rope_reference

from anyformer_gguf_gpu.kernels import ATTENTION_CHUNK, attention_scratch_bytes
from anyformer_gguf_gpu.quants import F32, Q4_0, Q8_0, dequantize
from anyformer_gguf_gpu.testing import random_blocks


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh form in float64 (ggml's, Gemma's)."""
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize(("fmt", "cols"), [(F32, 77), (Q4_0, 64)], ids=["F32", "Q4_0"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_matvec_can_read_gelu_of_gate_up_rows(gpu, matrix_kernels, rng, fmt, cols, tokens):
    """Gemma's down projection input: gelu(gate) * up from [gate | up] rows, gates far past the saturation points
    (±40) included, accumulated into y as the routed experts are."""
    kernels = matrix_kernels
    rows = 9
    raw = random_blocks(fmt, rows * cols, rng)
    weights = dequantize(raw, fmt.ggml_type).reshape(rows, cols)
    gate_up = rng.standard_normal((tokens, 2 * cols)).astype(np.float32) * 3
    gate_up[:, :4] = [-40.0, 40.0, -9.0, 0.0]
    start = rng.standard_normal((tokens, rows)).astype(np.float32)
    y = gpu.upload(start)
    dispatch = kernels.matvec(
        gpu.upload(raw), fmt, rows, cols, gpu.upload(gate_up), y, tokens=tokens, swiglu=True, gelu=True, accumulate=True
    )
    kernels.run([dispatch])
    hidden = gelu_tanh(gate_up[:, :cols]) * gate_up[:, cols:]
    _close(gpu.read(y, np.float32, tokens * rows).reshape(tokens, rows), start + hidden @ weights.T)


def test_gelu_is_only_a_gate_activation(gpu, kernels):
    buf = gpu.buffer(64)
    with pytest.raises(ValueError, match="swiglu"):
        kernels.matvec(buf, F32, 2, 8, buf, buf, gelu=True)


def test_embed_scales_the_rows_it_looks_up(gpu, kernels, rng):
    rows, cols, pos, scale = 11, 64, 1, float(np.sqrt(64.0))
    raw = random_blocks(Q8_0, rows * cols, rng)
    table = dequantize(raw, Q8_0.ggml_type).reshape(rows, cols)
    ids = np.array([0, 9, 4, 0], dtype=np.uint32)
    y = gpu.buffer(2 * cols * 4)
    dispatch = kernels.embed(gpu.upload(raw), Q8_0, rows, cols, gpu.upload(ids), y, _state(gpu, pos), 2, scale=scale)
    kernels.run([dispatch])
    got = gpu.read(y, np.float32, 2 * cols).reshape(2, cols)
    np.testing.assert_array_equal(got, table[[9, 4]] * np.float32(scale))


@pytest.mark.parametrize("scale", [1.0, 0.75])
def test_rmsnorm_can_add_to_a_residual_and_scale_the_sum(gpu, kernels, rng, scale):
    n, tokens, eps = 77, 3, 1e-6
    x = rng.standard_normal((tokens + 1, n)).astype(np.float32) * 3
    w = rng.standard_normal(n).astype(np.float32)
    residual = rng.standard_normal((tokens, n)).astype(np.float32)
    y = gpu.upload(residual)
    kernels.run(
        [kernels.rmsnorm(gpu.upload(x), gpu.upload(w), y, n, eps, tokens=tokens, x_off=n, accumulate=True, scale=scale)]
    )
    want = (residual + _rms(x[1:], w, eps)) * scale
    _close(gpu.read(y, np.float32, tokens * n).reshape(tokens, n), want)


@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk-norm"])
def test_rope_store_can_normalise_the_v_heads_without_a_weight(gpu, kv_kernels, rng, qk_norm):
    """Gemma 4's v: each head RMS-normalised, no weight, not rotated, then stored; q and k as before (NEOX,
    a rotary narrower than the head)."""
    kernels = kv_kernels
    n_head, n_kv, hd, n_rot, tokens, pos0, ctx, base, eps = 3, 1, 20, 12, 2, 4, 9, 10000.0, 1e-6
    q_dim, kv_dim = n_head * hd, n_kv * hd
    qkv = (rng.standard_normal((tokens, q_dim + 2 * kv_dim)) * 4).astype(np.float32)
    norm = rng.standard_normal(2 * hd).astype(np.float32)
    qkv_buf = gpu.upload(qkv)
    k_cache, v_cache = gpu.buffer(ctx * kv_dim * 4), gpu.buffer(ctx * kv_dim * 4)
    dispatch = kernels.rope_store(
        qkv_buf, k_cache, v_cache, gpu.upload(cos_sin_table(ctx, n_rot, base)), gpu.upload(norm),
        _state(gpu, pos0, tokens), n_head=n_head, n_kv=n_kv, head_dim=hd, n_rot=n_rot, neox=True,
        tokens=tokens, qk_norm=qk_norm, eps=eps, v_norm=True,
    )  # fmt: skip
    kernels.run([dispatch])
    q = qkv[:, :q_dim].reshape(tokens, n_head, hd)
    k = qkv[:, q_dim : q_dim + kv_dim].reshape(tokens, n_kv, hd)
    v = qkv[:, q_dim + kv_dim :].reshape(tokens, n_kv, hd)
    if qk_norm:
        q, k = _rms(q, norm[:hd], eps), _rms(k, norm[hd:], eps)
    pos = np.arange(pos0, pos0 + tokens, dtype=np.float64)
    got = gpu.read(qkv_buf, np.float32, qkv.size).reshape(qkv.shape)
    _close(got[:, :q_dim].reshape(tokens, n_head, hd), rope_reference(q, pos, n_rot, base, True))
    f16 = kernels.kv_f16
    tol = {"rtol": 1e-3, "atol": 1e-3} if f16 else {"rtol": 0, "atol": 2e-5 * 8}
    read = np.float16 if f16 else np.float32
    kc = gpu.read(k_cache, read, ctx * kv_dim).astype(np.float32).reshape(ctx, n_kv, hd)
    vc = gpu.read(v_cache, read, ctx * kv_dim).astype(np.float32).reshape(ctx, n_kv, hd)
    np.testing.assert_allclose(kc[pos0 : pos0 + tokens], rope_reference(k, pos, n_rot, base, True), **tol)
    np.testing.assert_allclose(vc[pos0 : pos0 + tokens], _rms(v, np.float32(1.0), eps), **tol)
    assert not vc[:pos0].any() and not vc[pos0 + tokens :].any()


def _window_reference(qkv, kc, vc, pos0, tokens, n_head, n_kv, hd, window, scale):
    """Causal attention over each token's last ``window`` keys, float64: [token, head, dim]."""
    group = n_head // n_kv
    out = np.zeros((tokens, n_head, hd))
    for t in range(tokens):
        n = pos0 + t + 1
        lo = max(0, n - window)
        for h in range(n_head):
            span = slice((h // group) * hd, (h // group + 1) * hd)
            s = kc[lo:n, span].astype(np.float64) @ qkv[t, h * hd : (h + 1) * hd].astype(np.float64) * scale
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ vc[lo:n, span]
    return out


@pytest.mark.parametrize(("n_head", "n_kv", "hd"), [(4, 2, 16), (3, 1, 10)], ids=["vec4", "scalar"])
@pytest.mark.parametrize(
    ("pos0", "tokens", "ctx", "window", "split"),
    [
        (70, 3, 80, 5, False),
        (2, 3, 80, 5, False),
        (70, 1, 80, 1, False),
        (600, 2, 703, 7, True),
        (510, 2, 703, 300, True),
    ],
    ids=["window-inside", "window-past-the-start", "window-of-one", "split-last-chunk-only", "split-across-chunks"],
)
def test_attention_sees_only_its_sliding_window(
    gpu, kv_kernels, rng, n_head, n_kv, hd, pos0, tokens, ctx, window, split
):
    """Sliding-window attention at scale 1 (Gemma 4's): windows shorter than the sequence, longer than the
    positions so far, of a single key; split along the sequence, chunks wholly before the window leave empty
    partials (the 300-key window spans chunks 1 and 2 of 256 keys, chunk 0 is out)."""
    assert ATTENTION_CHUNK == 256  # the split cases are chosen around this edge
    kernels = kv_kernels
    q_dim, kv_dim = n_head * hd, n_kv * hd
    qkv = rng.standard_normal((tokens, q_dim + 2 * kv_dim)).astype(np.float32)
    kc = rng.standard_normal((ctx, kv_dim)).astype(np.float16).astype(np.float32)
    vc = rng.standard_normal((ctx, kv_dim)).astype(np.float16).astype(np.float32)
    out = gpu.buffer(tokens * q_dim * 4)
    scores = gpu.buffer(attention_scratch_bytes(tokens, n_head, ctx, hd))
    state = _state(gpu, pos0, tokens)
    dims = {"n_head": n_head, "head_dim": hd, "ctx": ctx, "tokens": tokens}
    dispatch = kernels.attention(
        gpu.upload(qkv), _cache(gpu, kernels, kc), _cache(gpu, kernels, vc), out, scores, state,
        n_kv=n_kv, scale=1.0, split=split, window=window, **dims,
    )  # fmt: skip
    combine = [kernels.attention_combine(scores, out, state, **dims)] if split else []
    kernels.run([dispatch, *combine])
    got = gpu.read(out, np.float32, tokens * q_dim).reshape(tokens, n_head, hd)
    _close(got, _window_reference(qkv, kc, vc, pos0, tokens, n_head, n_kv, hd, window, 1.0))


def test_attention_refuses_a_negative_window(gpu, kernels):
    buf = gpu.buffer(64)
    with pytest.raises(ValueError, match="window"):
        kernels.attention(buf, buf, buf, buf, buf, buf, n_head=1, n_kv=1, head_dim=8, ctx=4, scale=1.0, window=-1)


def _ring_of(full: np.ndarray, last: int, ring: int) -> np.ndarray:
    """The ring a sliding layer holds after position ``last``: position p at row p % ring for the ``ring`` positions
    up to ``last``, garbage (never to be read) in rows no position reached yet."""
    out = np.full((ring, full.shape[1]), 1e3, dtype=np.float32)  # large, so a stray read would show
    for p in range(max(0, last - ring + 1), last + 1):
        out[p % ring] = full[p]
    return out


@pytest.mark.parametrize(("n_head", "n_kv", "hd"), [(4, 2, 16), (3, 1, 10)], ids=["vec4", "scalar"])
@pytest.mark.parametrize(
    ("pos0", "tokens", "ctx", "window", "ring", "split"),
    [
        (70, 1, 80, 5, 5, False),
        (70, 3, 80, 5, 7, False),
        (2, 3, 80, 5, 7, False),
        (600, 2, 703, 300, 301, True),
    ],
    ids=["one-token-ring-of-window", "three-tokens-ring-of-window+2", "before-the-ring-wraps", "split-across-chunks"],
)
def test_attention_reads_a_sliding_layers_ring(
    gpu, kv_kernels, rng, n_head, n_kv, hd, pos0, tokens, ctx, window, ring, split
):
    """A sliding layer's cache as a ring of window + tokens - 1 rows (position p at row p % ring) gives the same
    attention as the whole cache: each token sees the last ``window`` positions, wherever the ring has wrapped."""
    kernels = kv_kernels
    q_dim, kv_dim = n_head * hd, n_kv * hd
    qkv = rng.standard_normal((tokens, q_dim + 2 * kv_dim)).astype(np.float32)
    kc = rng.standard_normal((ctx, kv_dim)).astype(np.float16).astype(np.float32)
    vc = rng.standard_normal((ctx, kv_dim)).astype(np.float16).astype(np.float32)
    last = pos0 + tokens - 1
    out = gpu.buffer(tokens * q_dim * 4)
    scores = gpu.buffer(attention_scratch_bytes(tokens, n_head, ctx, hd))
    state = _state(gpu, pos0, tokens)
    dims = {"n_head": n_head, "head_dim": hd, "ctx": ctx, "tokens": tokens}
    k_ring, v_ring = _cache(gpu, kernels, _ring_of(kc, last, ring)), _cache(gpu, kernels, _ring_of(vc, last, ring))
    dispatch = kernels.attention(
        gpu.upload(qkv), k_ring, v_ring, out, scores, state,
        n_kv=n_kv, scale=1.0, split=split, window=window, ring=ring, **dims,
    )  # fmt: skip
    combine = [kernels.attention_combine(scores, out, state, **dims)] if split else []
    kernels.run([dispatch, *combine])
    got = gpu.read(out, np.float32, tokens * q_dim).reshape(tokens, n_head, hd)
    _close(got, _window_reference(qkv, kc, vc, pos0, tokens, n_head, n_kv, hd, window, 1.0))


def test_rope_store_writes_position_p_at_row_p_mod_ring(gpu, kv_kernels, rng):
    """Three tokens at positions 6..8 into a ring of 4 rows: rows 2, 3, 0 take them, row 1 keeps what it held."""
    kernels = kv_kernels
    n_head, n_kv, hd, n_rot, tokens, pos0, ring, ctx, base, eps = 2, 1, 12, 8, 3, 6, 4, 16, 10000.0, 1e-6
    q_dim, kv_dim = n_head * hd, n_kv * hd
    qkv = rng.standard_normal((tokens, q_dim + 2 * kv_dim)).astype(np.float32)
    before = rng.standard_normal((ring, kv_dim)).astype(np.float16).astype(np.float32)
    k_cache, v_cache = _cache(gpu, kernels, before), _cache(gpu, kernels, before)
    dispatch = kernels.rope_store(
        gpu.upload(qkv), k_cache, v_cache, gpu.upload(cos_sin_table(ctx, n_rot, base)),
        gpu.upload(np.ones(2 * hd, dtype=np.float32)), _state(gpu, pos0, tokens), n_head=n_head, n_kv=n_kv,
        head_dim=hd, n_rot=n_rot, neox=True, tokens=tokens, eps=eps, v_norm=True, ring=ring,
    )  # fmt: skip
    kernels.run([dispatch])
    k = qkv[:, q_dim : q_dim + kv_dim].reshape(tokens, n_kv, hd)
    v = qkv[:, q_dim + kv_dim :].reshape(tokens, n_kv, hd)
    pos = np.arange(pos0, pos0 + tokens, dtype=np.float64)
    f16 = kernels.kv_f16
    tol = {"rtol": 1e-3, "atol": 1e-3} if f16 else {"rtol": 0, "atol": 2e-5 * 8}
    read = np.float16 if f16 else np.float32
    kc = gpu.read(k_cache, read, ring * kv_dim).astype(np.float32).reshape(ring, n_kv, hd)
    vc = gpu.read(v_cache, read, ring * kv_dim).astype(np.float32).reshape(ring, n_kv, hd)
    rows = [p % ring for p in range(pos0, pos0 + tokens)]
    assert rows == [2, 3, 0]
    np.testing.assert_allclose(kc[rows], rope_reference(k, pos, n_rot, base, True), **tol)
    np.testing.assert_allclose(vc[rows], _rms(v, np.float32(1.0), eps), **tol)
    np.testing.assert_array_equal(kc[1], before[1].reshape(n_kv, hd))


def test_attention_refuses_a_window_its_ring_cannot_hold(gpu, kernels):
    buf = gpu.buffer(64)
    dims = {"n_head": 1, "n_kv": 1, "head_dim": 8, "ctx": 4, "scale": 1.0}
    for window in (0, 5):
        with pytest.raises(ValueError, match="ring"):
            kernels.attention(buf, buf, buf, buf, buf, buf, window=window, ring=4, **dims)


@pytest.mark.parametrize(("pos", "tokens", "split"), [(30, 3, False), (30, 1, False), (300, 2, True)])
def test_attention_with_rope_stores_and_reads_a_ring(gpu, kv_kernels, rng, pos, tokens, split):
    """The rotating attention kernel on a ring of window + tokens - 1 rows: each token stores its k and v at row
    p % ring and sees the last ``window`` positions, the step's earlier ones from the q/k/v rows and the rest from
    the ring (whose other rows hold positions the window no longer shows)."""
    from anyformer_gguf_gpu.kernels import AttentionRope

    kernels = kv_kernels
    n_head, n_kv, hd, n_rot, ctx, window, base, eps = 4, 2, 16, 8, 520, 5, 10000.0, 1e-6
    ring = window + tokens - 1
    q_dim, kv_dim = n_head * hd, n_kv * hd
    qkv = rng.standard_normal((tokens, q_dim + 2 * kv_dim)).astype(np.float32)
    norm = rng.standard_normal(2 * hd).astype(np.float32)
    kc = rng.standard_normal((ctx, kv_dim)).astype(np.float16).astype(np.float32)
    vc = rng.standard_normal((ctx, kv_dim)).astype(np.float16).astype(np.float32)
    k_ring, v_ring = (
        _cache(gpu, kernels, _ring_of(kc, pos - 1, ring)),
        _cache(gpu, kernels, _ring_of(vc, pos - 1, ring)),
    )
    rope = AttentionRope(gpu.upload(cos_sin_table(ctx, n_rot, base)), gpu.upload(norm), n_rot, True, True, eps)
    out = gpu.buffer(tokens * q_dim * 4)
    scores, state = gpu.buffer(attention_scratch_bytes(tokens, n_head, ctx, hd)), _state(gpu, pos, tokens)
    dims = {"n_head": n_head, "head_dim": hd, "ctx": ctx, "tokens": tokens}
    dispatch = kernels.attention_with_rope(
        rope, gpu.upload(qkv), k_ring, v_ring, out, scores, state,
        n_kv=n_kv, scale=1.0, split=split, window=window, ring=ring, **dims,
    )  # fmt: skip
    combine = [kernels.attention_combine(scores, out, state, **dims)] if split else []
    kernels.run([dispatch, *combine])
    q = _rms(qkv[:, :q_dim].reshape(tokens, n_head, hd), norm[:hd], eps)
    k = _rms(qkv[:, q_dim : q_dim + kv_dim].reshape(tokens, n_kv, hd), norm[hd:], eps)
    at = np.arange(pos, pos + tokens, dtype=np.float64)
    q, k = rope_reference(q, at, n_rot, base, True), rope_reference(k, at, n_rot, base, True)
    keys, values = kc.astype(np.float64), vc.astype(np.float64)
    keys[pos : pos + tokens], values[pos : pos + tokens] = k.reshape(tokens, -1), qkv[:, q_dim + kv_dim :]
    rotated = np.concatenate([q.reshape(tokens, -1), keys[pos : pos + tokens], values[pos : pos + tokens]], axis=1)
    got = gpu.read(out, np.float32, tokens * q_dim).reshape(tokens, n_head, hd)
    want = _window_reference(rotated, keys, values, pos, tokens, n_head, n_kv, hd, window, 1.0)
    _close(got, want, rel=2e-4 if kernels.kv_f16 else 2e-5)
    cache_k = _read_cache(gpu, kernels, k_ring, ring * kv_dim).reshape(ring, kv_dim)
    rows = [p % ring for p in range(pos, pos + tokens)]
    tol = {"rtol": 1e-3, "atol": 1e-3} if kernels.kv_f16 else {"rtol": 0, "atol": 1e-5}
    np.testing.assert_allclose(cache_k[rows], k.reshape(tokens, -1), **tol)
