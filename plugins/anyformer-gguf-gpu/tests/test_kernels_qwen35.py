"""The kernel variants qwen35moe (Qwen3.5/3.6 MoE) needs on wgpu, against numpy on random data (lavapipe in CI).

The gated attention (each query head followed by its output gate; the output scaled by its sigmoid),
the ungated depthwise convolution with SiLU, and the gated delta rule with its per-head norm and
silu(z), over several steps (the state stays on the GPU; position 0 starts from zeros).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_kernels import _cache, _close, _rms, _state, cos_sin_table, rope_reference

from anyformer_gguf_gpu.lfm2_config import MAX_CONV_TAPS
from anyformer_gguf_gpu.shortconv import ShortConvKernel


@pytest.mark.parametrize(("n_head", "n_kv", "hd"), [(4, 2, 16), (3, 1, 10)], ids=["vec4", "scalar"])
def test_gated_attention_reads_interleaved_queries_and_scales_by_the_gate(gpu, kv_kernels, rng, n_head, n_kv, hd):
    kernels = kv_kernels
    tokens, pos0, ctx = 2, 70, 80
    kv_dim = n_kv * hd
    qkv = rng.standard_normal((tokens, n_head * 2 * hd + 2 * kv_dim)).astype(np.float32)
    kc = rng.standard_normal((ctx, kv_dim)).astype(np.float16).astype(np.float32)
    vc = rng.standard_normal((ctx, kv_dim)).astype(np.float16).astype(np.float32)
    out = gpu.buffer(tokens * n_head * hd * 4)
    scale = float(1 / np.sqrt(hd))
    dispatch = kernels.attention(
        gpu.upload(qkv), _cache(gpu, kernels, kc), _cache(gpu, kernels, vc), out, gpu.buffer(tokens * n_head * ctx * 4),
        _state(gpu, pos0, tokens), n_head=n_head, n_kv=n_kv, head_dim=hd, ctx=ctx, scale=scale, tokens=tokens,
        gated=True,
    )  # fmt: skip
    kernels.run([dispatch])
    got = gpu.read(out, np.float32, tokens * n_head * hd).reshape(tokens, n_head, hd)
    heads = qkv[:, : n_head * 2 * hd].reshape(tokens, n_head, 2, hd).astype(np.float64)
    group = n_head // n_kv
    for t in range(tokens):
        n = pos0 + t + 1
        for h in range(n_head):
            span = slice((h // group) * hd, (h // group + 1) * hd)
            s = kc[:n, span] @ heads[t, h, 0] * scale
            p = np.exp(s - s.max())
            want = (p / p.sum()) @ vc[:n, span] / (1 + np.exp(-heads[t, h, 1]))
            _close(got[t, h], want)


def test_gated_attention_is_not_split(gpu, kernels):
    buf = gpu.buffer(64)
    with pytest.raises(ValueError, match="unsplit"):
        kernels.attention(
            buf, buf, buf, buf, buf, buf, n_head=1, n_kv=1, head_dim=8, ctx=4, scale=1.0, split=True, gated=True
        )


def test_rope_store_reads_queries_a_stride_apart(gpu, kernels, rng):
    """Queries 2 head_dim apart (each followed by its gate, left untouched); k and v after n_head × 2 head_dim."""
    n_head, n_kv, hd, n_rot, pos0, ctx, base, eps = 3, 1, 12, 8, 2, 6, 10000.0, 1e-6
    q_span, kv_dim = n_head * 2 * hd, n_kv * hd
    qkv = rng.standard_normal((1, q_span + 2 * kv_dim)).astype(np.float32)
    norm = rng.standard_normal(2 * hd).astype(np.float32)
    buf = gpu.upload(qkv)
    k_cache, v_cache = gpu.buffer(ctx * kv_dim * 4), gpu.buffer(ctx * kv_dim * 4)
    dispatch = kernels.rope_store(
        buf, k_cache, v_cache, gpu.upload(cos_sin_table(ctx, n_rot, base)), gpu.upload(norm), _state(gpu, pos0),
        n_head=n_head, n_kv=n_kv, head_dim=hd, n_rot=n_rot, neox=True, qk_norm=True, eps=eps, q_stride=2 * hd,
    )  # fmt: skip
    kernels.run([dispatch])
    got = gpu.read(buf, np.float32, qkv.size)
    heads = qkv[:, :q_span].reshape(1, n_head, 2, hd)
    pos = np.array([pos0], dtype=np.float64)
    want_q = rope_reference(_rms(heads[:, :, 0], norm[:hd], eps), pos, n_rot, base, True)
    _close(got[:q_span].reshape(1, n_head, 2, hd)[:, :, 0], want_q)
    np.testing.assert_array_equal(got[:q_span].reshape(1, n_head, 2, hd)[:, :, 1], heads[:, :, 1])
    k = qkv[:, q_span : q_span + kv_dim].reshape(1, n_kv, hd)
    kc = gpu.read(k_cache, np.float32, ctx * kv_dim).reshape(ctx, n_kv, hd)
    _close(kc[pos0 : pos0 + 1], rope_reference(_rms(k, norm[hd:], eps), pos, n_rot, base, True))
    vc = gpu.read(v_cache, np.float32, ctx * kv_dim).reshape(ctx, kv_dim)
    np.testing.assert_array_equal(vc[pos0], qkv[0, q_span + kv_dim :])


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


@pytest.mark.parametrize(("n", "n_taps", "steps"), [(37, 4, (1, 1, 1, 1, 1)), (70, 2, (3, 1))])
def test_ungated_shortconv_is_silu_of_the_causal_convolution(gpu, rng, n, n_taps, steps):
    """Rows whose first n floats are x (then other projections), steps that carry the state, stale state ignored
    at position 0."""
    from anyformer_gguf_gpu.kernels import Kernels

    conv = ShortConvKernel(Kernels(gpu), gated=False)
    stride = n + 5
    total = sum(steps)
    rows = rng.standard_normal((total, stride)).astype(np.float32)
    taps = rng.standard_normal((n, n_taps)).astype(np.float32)
    state = gpu.buffer((MAX_CONV_TAPS - 1) * n * 4)
    gpu.write(state, rng.standard_normal((MAX_CONV_TAPS - 1) * n).astype(np.float32))
    taps_buf, kernels, got, pos = gpu.upload(taps), Kernels(gpu), [], 0
    for size in steps:
        y = gpu.buffer(size * n * 4)
        d = conv.dispatch(
            gpu.upload(rows[pos : pos + size]), taps_buf, state, y, _state(gpu, pos, size),
            n=n, n_taps=n_taps, tokens=size, x_stride=stride,
        )  # fmt: skip
        kernels.run([d])
        got.append(gpu.read(y, np.float32, size * n).reshape(size, n))
        pos += size
    x = np.concatenate([np.zeros((n_taps - 1, n)), rows[:, :n].astype(np.float64)])
    want = np.stack([(x[t : t + n_taps] * taps.T).sum(axis=0) for t in range(total)])
    _close(np.concatenate(got), _silu(want))


def delta_rule_reference(x, proj, dt, a, norm, state, hk, hv, hd, z_off, b_off, a_off, eps):
    """One token of the gated delta rule in float64, as llama.cpp's graph: returns (out, new state)."""
    keys = hk * hd
    q = x[:keys].reshape(hk, hd)
    k = x[keys : 2 * keys].reshape(hk, hd)
    v = x[2 * keys :].reshape(hv, hd)
    q = q / np.sqrt((q * q).sum(axis=-1, keepdims=True) + eps) / np.sqrt(hd)
    k = k / np.sqrt((k * k).sum(axis=-1, keepdims=True) + eps)
    tiled = np.arange(hv) % hk
    q, k = q[tiled], k[tiled]
    beta = 1 / (1 + np.exp(-proj[b_off : b_off + hv]))
    decay = np.exp(np.logaddexp(0, proj[a_off : a_off + hv] + dt) * a)
    state = state * decay[:, None, None]
    recalled = np.einsum("hij,hj->hi", state, k)
    state = state + ((v - recalled) * beta[:, None])[:, :, None] * k[:, None, :]
    o = np.einsum("hij,hj->hi", state, q)
    z = proj[z_off : z_off + hv * hd].reshape(hv, hd)
    out = o / np.sqrt((o * o).mean(axis=-1, keepdims=True) + eps) * norm * _silu(z)
    return out.reshape(-1), state


@pytest.mark.parametrize(("hk", "hv", "hd"), [(2, 4, 16), (1, 3, 70)])
def test_delta_rule_steps_match_numpy_and_restart_at_position_zero(gpu, kernels, rng, hk, hv, hd):
    """Four tokens in a row carry the state (head widths past one pass of the workgroup's 64 threads too); a step
    at position 0 ignores the stale state it finds."""
    eps, steps = 1e-6, 4
    channels = 2 * hk * hd + hv * hd
    z_off, b_off = 3, 3 + hv * hd  # the projection row: 3 unrelated floats, then z, beta, alpha
    a_off = b_off + hv
    dt = rng.standard_normal(hv)
    a = -np.exp(rng.standard_normal(hv) * 0.5)
    norm = 1 + 0.1 * rng.standard_normal(hd)
    vecs = gpu.upload(np.concatenate([dt, a, norm]).astype(np.float32))
    state_buf = gpu.upload((rng.standard_normal(hv * hd * hd) * 5).astype(np.float32))  # stale
    out = gpu.buffer(hv * hd * 4)
    state = np.zeros((hv, hd, hd))
    for pos in range(steps):
        x = (rng.standard_normal(channels) * 2).astype(np.float32)
        proj = (rng.standard_normal(a_off + hv) * 2).astype(np.float32)
        d = kernels.delta_rule(
            gpu.upload(x), gpu.upload(proj), vecs, state_buf, out, _state(gpu, pos),
            k_heads=hk, v_heads=hv, head_dim=hd, z_off=z_off, beta_off=b_off, alpha_off=a_off, eps=eps,
        )  # fmt: skip
        kernels.run([d])
        args = (dt, a, norm, state, hk, hv, hd, z_off, b_off, a_off, eps)
        want, state = delta_rule_reference(x.astype(np.float64), proj.astype(np.float64), *args)
        _close(gpu.read(out, np.float32, hv * hd), want, rel=1e-4)
    _close(gpu.read(state_buf, np.float32, hv * hd * hd).reshape(hv, hd, hd), state, rel=1e-4)
