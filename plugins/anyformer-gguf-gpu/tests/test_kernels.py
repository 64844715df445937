"""Every WGSL kernel against numpy on random data, on the adapter wgpu finds (lavapipe in CI).

Shapes are small (lavapipe runs shaders on the CPU) and deliberately odd: row counts that are not
multiples of the workgroup, rows of few blocks, float rows whose length is not a multiple of 8.
Tolerances: the kernels sum in f32 in a different order than numpy's f64-accumulated products,
so errors are a few f32 ulps of the largest partial sums, far below what a layout bug gives (O(1)).
"""

from __future__ import annotations

import numpy as np
import pytest

from anyformer_gguf_gpu.kernels import Kernels, RopeStore, decode_layout
from anyformer_gguf_gpu.quants import F16, F32, FORMATS, Q4_0, Q4_1, Q4_K, Q6_K, Q8_0, dequantize
from anyformer_gguf_gpu.testing import random_blocks


def _cols_for(fmt, blocks: int) -> int:
    return fmt.block_size * blocks if fmt.block_size > 1 else 8 * blocks + 5


def _state(gpu, pos: int, n_batch: int = 1):
    return gpu.upload(np.array([pos, n_batch, 0, 0], dtype=np.uint32))


def _close(got, want, rel=2e-5):
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * scale * 8)


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.name)
@pytest.mark.parametrize(("rows", "blocks", "tokens"), [(37, 3, 1), (5, 1, 3), (70, 2, 11)])
def test_matvec_reads_raw_blocks(gpu, matrix_kernels, rng, fmt, rows, blocks, tokens):
    kernels = matrix_kernels
    cols = _cols_for(fmt, blocks)
    raw = random_blocks(fmt, rows * cols, rng)
    weights = dequantize(raw, fmt.ggml_type).reshape(rows, cols)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    y = gpu.buffer(tokens * rows * 4)
    kernels.run([kernels.matvec(gpu.upload(raw), fmt, rows, cols, gpu.upload(x), y, tokens=tokens)])
    got = gpu.read(y, np.float32, tokens * rows).reshape(tokens, rows)
    _close(got, x.astype(np.float64) @ weights.T.astype(np.float64))


def test_matvec_accumulates_and_honours_offsets(gpu, matrix_kernels, rng):
    kernels = matrix_kernels
    rows, cols = 70, 64
    raw = random_blocks(Q4_0, rows * cols, rng)
    weights = dequantize(raw, Q4_0.ggml_type).reshape(rows, cols)
    x = rng.standard_normal(3 * cols).astype(np.float32)
    start = rng.standard_normal(rows + 10).astype(np.float32)
    y = gpu.upload(start)
    kernels.run(
        [kernels.matvec(gpu.upload(raw), Q4_0, rows, cols, gpu.upload(x), y, x_off=cols, y_off=10, accumulate=True)]
    )
    got = gpu.read(y, np.float32, rows + 10)
    np.testing.assert_array_equal(got[:10], start[:10])
    _close(got[10:], start[10:] + weights @ x[cols : 2 * cols])


def test_matvec_can_read_swiglu_of_gate_up_rows(gpu, matrix_kernels, rng):
    """The down projection's input: silu(gate) * up computed from [gate | up] rows as the matrix reads them."""
    kernels = matrix_kernels
    rows, cols, tokens = 9, 64, 3
    raw = random_blocks(Q4_0, rows * cols, rng)
    weights = dequantize(raw, Q4_0.ggml_type).reshape(rows, cols)
    gate_up = rng.standard_normal((tokens, 2 * cols)).astype(np.float32) * 3
    y = gpu.buffer(tokens * rows * 4)
    kernels.run([kernels.matvec(gpu.upload(raw), Q4_0, rows, cols, gpu.upload(gate_up), y, tokens=tokens, swiglu=True)])
    g, u = gate_up[:, :cols].astype(np.float64), gate_up[:, cols:]
    _close(gpu.read(y, np.float32, tokens * rows).reshape(tokens, rows), (g / (1 + np.exp(-g)) * u) @ weights.T)


@pytest.mark.parametrize("fmt", [Q4_0, F32], ids=lambda f: f.name)
def test_matvec_can_normalise_its_input(gpu, matrix_kernels, rng, fmt):
    """RMSNorm fused into the projection: W @ (x / rms(x) * norm), per token, offsets honoured."""
    kernels = matrix_kernels
    rows, tokens, eps = 13, 10, 1e-5
    cols = 64 if fmt is Q4_0 else 77
    raw = random_blocks(fmt, rows * cols, rng)
    weights = dequantize(raw, fmt.ggml_type).reshape(rows, cols)
    x = rng.standard_normal((tokens + 1, cols)).astype(np.float32) * 5
    norm = rng.standard_normal(cols).astype(np.float32)
    y = gpu.buffer(tokens * rows * 4)
    dispatch = kernels.matvec(
        gpu.upload(raw), fmt, rows, cols, gpu.upload(x), y, tokens=tokens, x_off=cols, norm=gpu.upload(norm), eps=eps
    )
    kernels.run([dispatch])
    xs = x[1:].astype(np.float64)
    normed = xs / np.sqrt((xs**2).mean(axis=1, keepdims=True) + eps) * norm
    _close(gpu.read(y, np.float32, tokens * rows).reshape(tokens, rows), normed @ weights.T)


@pytest.mark.parametrize(
    ("fmt", "cols", "x_off", "swiglu"), [(Q4_1, 96, 1, False), (F32, 77, 0, True), (Q6_K, 256, 2, True)]
)
def test_matvec_decoding_reads_inputs_at_any_offset(gpu, rng, fmt, cols, x_off, swiglu):
    """One token's product with its input at an odd offset, a [gate | up] row whose up half is not 4-aligned,
    and rows whose units are not a multiple of the threads a row, at 32 threads a row (a GPU's shape) and at 1
    (a CPU adapter's)."""
    rows = 11
    raw = random_blocks(fmt, rows * cols, rng)
    weights = dequantize(raw, fmt.ggml_type).reshape(rows, cols).astype(np.float64)
    width = 2 * cols if swiglu else cols
    x = rng.standard_normal(x_off + width).astype(np.float32)
    row = x[x_off:].astype(np.float64)
    vector = row[:cols] / (1 + np.exp(-row[:cols])) * row[cols:] if swiglu else row
    for tpr in (1, 32):
        kernels = Kernels(gpu, threads_per_row=tpr, subgroups=False)
        y = gpu.buffer(rows * 4)
        kernels.run([kernels.matvec(gpu.upload(raw), fmt, rows, cols, gpu.upload(x), y, x_off=x_off, swiglu=swiglu)])
        _close(gpu.read(y, np.float32, rows), weights @ vector)


def test_decode_layout_picks_the_shape_per_matrix():
    """The rule measured on an H200: heads get 256 threads, 8 a row; 3072-6144 rows 16 a row; up to ~1500 rows 64
    a row, in a 128-thread workgroup when the rope epilogue needs row pairs."""
    assert decode_layout(49152) == decode_layout(151936) == (256, 8)
    assert decode_layout(3072) == decode_layout(4096) == decode_layout(6144) == (64, 16)
    assert decode_layout(576) == decode_layout(1024) == decode_layout(960) == (64, 64)
    assert decode_layout(960, rope=True) == (128, 64)
    assert decode_layout(2048) == (64, 32)


@pytest.mark.parametrize("fmt", [Q4_1, Q4_K, Q8_0, F16], ids=lambda f: f.name)
@pytest.mark.parametrize(
    ("rows", "tokens", "layout"),
    [
        (16390, 1, (256, 8)),
        (3000, 1, (64, 16)),
        (2000, 1, (64, 32)),
        (300, 1, (64, 64)),
        (2100, 6, (256, 2)),
        (300, 6, (64, 4)),
    ],
)
def test_matvec_per_matrix_layouts_match_numpy(gpu, rng, fmt, rows, tokens, layout):
    """Products in each layout a GPU picks per matrix (row counts not a multiple of the workgroup's rows; one token,
    and several through the tiled kernel), with a normalised input and with a SwiGLU input, against numpy."""
    kernels = Kernels(gpu, threads_per_row=32, layout_per_matrix=True)
    assert kernels.matrix_layout(rows, kernels.tokens_per_thread(tokens)) == layout
    cols, eps = _cols_for(fmt, 2), 1e-5
    raw = random_blocks(fmt, rows * cols, rng)
    weights = dequantize(raw, fmt.ggml_type).reshape(rows, cols).astype(np.float64)
    w_buf = gpu.upload(raw)
    x = rng.standard_normal((tokens, 2 * cols)).astype(np.float32)
    norm = rng.standard_normal(cols).astype(np.float32)
    y = gpu.buffer(tokens * rows * 4)
    kernels.run(
        [
            kernels.matvec(
                w_buf,
                fmt,
                rows,
                cols,
                gpu.upload(x),
                y,
                tokens=tokens,
                x_stride=2 * cols,
                norm=gpu.upload(norm),
                eps=eps,
            )
        ]
    )
    got = gpu.read(y, np.float32, tokens * rows).reshape(tokens, rows)
    _close(got, _rms(x[:, :cols], norm, eps) @ weights.T)
    kernels.run([kernels.matvec(w_buf, fmt, rows, cols, gpu.upload(x), y, tokens=tokens, swiglu=True)])
    g, u = x[:, :cols].astype(np.float64), x[:, cols:]
    _close(gpu.read(y, np.float32, tokens * rows).reshape(tokens, rows), (g / (1 + np.exp(-g)) * u) @ weights.T)


def test_matvec_more_rows_than_one_dispatch_dimension(gpu, rng):
    """Workgroups past 65535 spill into the second dispatch dimension (vocabularies are this large)."""
    kernels = Kernels(gpu, threads_per_row=64)  # one row per workgroup: 65543 workgroups
    rows, cols = 65536 + 7, 8
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    x = rng.standard_normal(cols).astype(np.float32)
    y = gpu.buffer(rows * 4)
    kernels.run([kernels.matvec(gpu.upload(w), F32, rows, cols, gpu.upload(x), y)])
    _close(gpu.read(y, np.float32, rows), w @ x)


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.name)
def test_embed_looks_up_rows_by_id_on_the_gpu(gpu, kernels, rng, fmt):
    rows, cols, pos = 11, _cols_for(fmt, 2), 2
    raw = random_blocks(fmt, rows * cols, rng)
    table = dequantize(raw, fmt.ggml_type).reshape(rows, cols)
    ids = np.array([0, 0, 7, 3, 10, 0], dtype=np.uint32)
    y = gpu.buffer(3 * cols * 4)
    kernels.run([kernels.embed(gpu.upload(raw), fmt, rows, cols, gpu.upload(ids), y, _state(gpu, pos), 3)])
    np.testing.assert_array_equal(gpu.read(y, np.float32, 3 * cols).reshape(3, cols), table[[7, 3, 10]])


def test_rmsnorm(gpu, kernels, rng):
    n, tokens, eps = 77, 3, 1e-5
    x = rng.standard_normal((tokens, n)).astype(np.float32) * 3
    w = rng.standard_normal(n).astype(np.float32)
    y = gpu.buffer(tokens * n * 4)
    kernels.run([kernels.rmsnorm(gpu.upload(x), gpu.upload(w), y, n, eps, tokens=tokens)])
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + eps) * w
    _close(gpu.read(y, np.float32, tokens * n).reshape(tokens, n), want)


def cos_sin_table(ctx: int, n_rot: int, base: float) -> np.ndarray:
    """The rope table the kernels read: [pos][i] = (cos, sin) of pos * base^(-2i/n_rot)."""
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    angles = np.arange(ctx, dtype=np.float64)[:, None] * inv[None, :]
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1).astype(np.float32)


def rope_reference(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, neox: bool) -> np.ndarray:
    """Rotate each head's first n_rot dims (x: tokens × heads × head_dim)."""
    out = x.astype(np.float64).copy()
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    angles = pos[:, None, None] * inv[None, None, :]
    if neox:
        a, b = x[..., : n_rot // 2], x[..., n_rot // 2 : n_rot]
        out[..., : n_rot // 2] = a * np.cos(angles) - b * np.sin(angles)
        out[..., n_rot // 2 : n_rot] = a * np.sin(angles) + b * np.cos(angles)
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * np.cos(angles) - b * np.sin(angles)
        out[..., 1:n_rot:2] = a * np.sin(angles) + b * np.cos(angles)
    return out


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=-1, keepdims=True) + eps) * w


def _cache(gpu, kernels, values: np.ndarray):
    return gpu.upload(values.astype(np.float16 if kernels.kv_f16 else np.float32))


def _read_cache(gpu, kernels, buf, n: int) -> np.ndarray:
    return gpu.read(buf, np.float16 if kernels.kv_f16 else np.float32, n).astype(np.float32)


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk-norm"])
def test_rope_store_rotates_q_and_fills_the_cache(gpu, kv_kernels, rng, neox, qk_norm):
    kernels = kv_kernels
    n_head, n_kv, hd, n_rot, tokens, pos0, ctx, base, eps = 6, 2, 24, 16, 3, 5, 12, 10000.0, 1e-6
    q_dim, kv_dim = n_head * hd, n_kv * hd
    qkv = rng.standard_normal((tokens, q_dim + 2 * kv_dim)).astype(np.float32)
    norm = rng.standard_normal(2 * hd).astype(np.float32)
    qkv_buf = gpu.upload(qkv)
    k_cache, v_cache = gpu.buffer(ctx * kv_dim * 4), gpu.buffer(ctx * kv_dim * 4)
    dispatch = kernels.rope_store(
        qkv_buf, k_cache, v_cache, gpu.upload(cos_sin_table(ctx, n_rot, base)), gpu.upload(norm),
        _state(gpu, pos0, tokens), n_head=n_head, n_kv=n_kv, head_dim=hd, n_rot=n_rot, neox=neox,
        tokens=tokens, qk_norm=qk_norm, eps=eps,
    )  # fmt: skip
    kernels.run([dispatch])
    q = qkv[:, :q_dim].reshape(tokens, n_head, hd)
    k = qkv[:, q_dim : q_dim + kv_dim].reshape(tokens, n_kv, hd)
    v = qkv[:, q_dim + kv_dim :]
    if qk_norm:
        q, k = _rms(q, norm[:hd], eps), _rms(k, norm[hd:], eps)
    pos = np.arange(pos0, pos0 + tokens, dtype=np.float64)
    got = gpu.read(qkv_buf, np.float32, qkv.size).reshape(qkv.shape)
    _close(got[:, :q_dim].reshape(tokens, n_head, hd), rope_reference(q, pos, n_rot, base, neox))
    _close(got[:, q_dim:], qkv[:, q_dim:])  # k and v are left in place, copied to the caches
    kc = _read_cache(gpu, kernels, k_cache, ctx * kv_dim).reshape(ctx, kv_dim)
    vc = _read_cache(gpu, kernels, v_cache, ctx * kv_dim).reshape(ctx, kv_dim)
    want_k = rope_reference(k, pos, n_rot, base, neox)
    if kernels.kv_f16:  # f16 holds 11 significant bits
        np.testing.assert_allclose(kc[pos0 : pos0 + tokens].reshape(tokens, n_kv, hd), want_k, rtol=1e-3, atol=1e-3)
        np.testing.assert_array_equal(vc[pos0 : pos0 + tokens], v.astype(np.float16).astype(np.float32))
    else:
        _close(kc[pos0 : pos0 + tokens].reshape(tokens, n_kv, hd), want_k)
        np.testing.assert_array_equal(vc[pos0 : pos0 + tokens], v)
    assert not kc[:pos0].any() and not vc[pos0 + tokens :].any()


@pytest.mark.parametrize("fmt", [Q4_1, Q6_K, F16], ids=lambda f: f.name)
@pytest.mark.parametrize(
    ("tpr", "subgroups", "per_matrix"),
    [(1, False, False), (32, False, False), (32, True, False), (4, True, False), (32, True, True)],
    ids=["1", "32", "32-subgroups", "4-subgroups", "per-matrix"],
)
@pytest.mark.parametrize("kv_f16", [False, True], ids=["f32-cache", "f16-cache"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_matvec_rope_epilogue_rotates_and_fills_the_cache(gpu, rng, fmt, tpr, subgroups, per_matrix, kv_f16, tokens):
    """The stacked q/k/v projection with rope fused: normed input, rotated q and k, k and v in the cache (with
    ``per_matrix``, one token's 80 rows take a GPU's layout for them: 128 threads, 64 a row, two rows)."""
    if kv_f16 and not gpu.has_f16:
        pytest.skip("the adapter has no shader-f16")
    if subgroups and not gpu.has_subgroups:
        pytest.skip("the adapter has no subgroups")
    kernels = Kernels(gpu, threads_per_row=tpr, kv_f16=kv_f16, subgroups=subgroups, layout_per_matrix=per_matrix)
    n_head, n_kv, hd, n_rot, pos0, ctx, base, eps = 4, 2, 10, 6, 5, 12, 10000.0, 1e-5
    q_dim, kv_dim = n_head * hd, n_kv * hd
    rows, cols = q_dim + 2 * kv_dim, _cols_for(fmt, 1)
    raw = random_blocks(fmt, rows * cols, rng)
    weights = dequantize(raw, fmt.ggml_type).reshape(rows, cols)
    x = rng.standard_normal((tokens, cols)).astype(np.float32) * 3
    norm = rng.standard_normal(cols).astype(np.float32)
    y = gpu.buffer(tokens * rows * 4)
    k_cache, v_cache = gpu.buffer(ctx * kv_dim * 4), gpu.buffer(ctx * kv_dim * 4)
    table, state = gpu.upload(cos_sin_table(ctx, n_rot, base)), _state(gpu, pos0, tokens)
    store = RopeStore(k_cache, v_cache, table, state, hd, n_rot, q_dim, kv_dim)
    dispatch = kernels.matvec(
        gpu.upload(raw), fmt, rows, cols, gpu.upload(x), y, tokens=tokens, norm=gpu.upload(norm), eps=eps, rope=store
    )
    kernels.run([dispatch])
    qkv = _rms(x, norm, eps) @ weights.T.astype(np.float64)
    pos = np.arange(pos0, pos0 + tokens, dtype=np.float64)
    want_q = rope_reference(qkv[:, :q_dim].reshape(tokens, n_head, hd), pos, n_rot, base, False)
    want_k = rope_reference(qkv[:, q_dim : q_dim + kv_dim].reshape(tokens, n_kv, hd), pos, n_rot, base, False)
    want_v = qkv[:, q_dim + kv_dim :]
    got = gpu.read(y, np.float32, tokens * rows).reshape(tokens, rows)
    _close(got[:, :q_dim].reshape(tokens, n_head, hd), want_q)
    _close(got[:, q_dim : q_dim + kv_dim].reshape(tokens, n_kv, hd), want_k)
    _close(got[:, q_dim + kv_dim :], want_v)
    kc = _read_cache(gpu, kernels, k_cache, ctx * kv_dim).reshape(ctx, kv_dim)
    vc = _read_cache(gpu, kernels, v_cache, ctx * kv_dim).reshape(ctx, kv_dim)
    tol = {"rtol": 1e-3, "atol": 1e-3 * max(1.0, float(np.abs(qkv).max()))} if kv_f16 else {"rtol": 0, "atol": 0}
    np.testing.assert_allclose(kc[pos0 : pos0 + tokens], got[:, q_dim : q_dim + kv_dim], **tol)
    np.testing.assert_allclose(vc[pos0 : pos0 + tokens], got[:, q_dim + kv_dim :], **tol)
    assert not kc[:pos0].any() and not vc[pos0 + tokens :].any()


def test_matvec_rope_epilogue_refuses_rows_without_pairs(gpu):
    """One row per workgroup cannot rotate a row against its partner: refused, not computed wrong."""
    kernels = Kernels(gpu, threads_per_row=64)
    buf = gpu.buffer(64)
    store = RopeStore(buf, buf, buf, buf, 8, 8, 16, 8)
    with pytest.raises(ValueError, match="row pairs"):
        kernels.matvec(buf, F32, 32, 8, buf, buf, rope=store)


@pytest.mark.parametrize(("n_head", "n_kv", "hd"), [(4, 2, 16), (3, 3, 72), (4, 2, 10), (2, 1, 70)])
def test_attention_is_causal_softmax_over_the_cache(gpu, kv_kernels, rng, n_head, n_kv, hd):
    """Widths that are multiples of 4 (the vec4 kernel; 72 takes two passes of its 16 lanes) and that are not."""
    kernels = kv_kernels
    tokens, pos0, ctx = 3, 70, 80  # 70+ keys: more than one pass of the 64 threads over the sequence
    q_dim, kv_dim = n_head * hd, n_kv * hd
    qkv = rng.standard_normal((tokens, q_dim + 2 * kv_dim)).astype(np.float32)
    # Cache values exactly representable in both f16 and f32, so one reference serves both caches.
    kc = rng.standard_normal((ctx, kv_dim)).astype(np.float16).astype(np.float32)
    vc = rng.standard_normal((ctx, kv_dim)).astype(np.float16).astype(np.float32)
    out = gpu.buffer(tokens * q_dim * 4)
    scale = 1 / np.sqrt(hd)
    dispatch = kernels.attention(
        gpu.upload(qkv), _cache(gpu, kernels, kc), _cache(gpu, kernels, vc), out, gpu.buffer(tokens * n_head * ctx * 4),
        _state(gpu, pos0, tokens), n_head=n_head, n_kv=n_kv, head_dim=hd, ctx=ctx, scale=float(scale), tokens=tokens,
    )  # fmt: skip
    kernels.run([dispatch])
    got = gpu.read(out, np.float32, tokens * q_dim).reshape(tokens, n_head, hd)
    group = n_head // n_kv
    for t in range(tokens):
        n = pos0 + t + 1
        for h in range(n_head):
            kvh = h // group
            q = qkv[t, h * hd : (h + 1) * hd].astype(np.float64)
            keys = kc[:n, kvh * hd : (kvh + 1) * hd]
            scores = keys @ q * scale
            p = np.exp(scores - scores.max())
            want = (p / p.sum()) @ vc[:n, kvh * hd : (kvh + 1) * hd]
            _close(got[t, h], want)


def _attention_reference(qkv, kc, vc, pos0, tokens, n_head, n_kv, hd):
    """Causal softmax attention in float64: [token, head, dim] for tokens at pos0.. over the caches."""
    q_dim, group, scale = n_head * hd, n_head // n_kv, 1 / np.sqrt(hd)
    out = np.zeros((tokens, n_head, hd))
    for t in range(tokens):
        n = pos0 + t + 1
        for h in range(n_head):
            span = slice((h // group) * hd, (h // group + 1) * hd)
            scores = kc[:n, span].astype(np.float64) @ qkv[t, h * hd : (h + 1) * hd].astype(np.float64) * scale
            p = np.exp(scores - scores.max())
            out[t, h] = (p / p.sum()) @ vc[:n, span]
    assert out.shape[2] * n_head == q_dim
    return out


@pytest.mark.parametrize(("n_head", "n_kv", "hd"), [(4, 2, 16), (6, 2, 12), (3, 3, 10)])
@pytest.mark.parametrize(
    ("pos0", "tokens", "ctx"),
    [(0, 1, 300), (254, 3, 300), (600, 2, 703), (767, 1, 768)],
    ids=["one-key", "across-a-chunk-edge", "odd-tail", "full-cache"],
)
def test_attention_split_along_the_sequence_matches_numpy(gpu, kv_kernels, rng, n_head, n_kv, hd, pos0, tokens, ctx):
    """Flash-decoding: chunks of ATTENTION_CHUNK keys per workgroup, then the combine dispatch.

    Lengths 1, 255..257 (a chunk edge), 601..602 (a short last chunk) and a whole cache of three
    chunks; GQA and MHA; head widths a multiple of 4 (vec4 kernel) and not (10). Scores far apart
    (q scaled up) make each chunk's max matter in the combine.
    """
    from anyformer_gguf_gpu.kernels import ATTENTION_CHUNK, attention_scratch_bytes

    assert ATTENTION_CHUNK == 256  # the lengths above are chosen around this edge
    kernels = kv_kernels
    q_dim, kv_dim = n_head * hd, n_kv * hd
    qkv = rng.standard_normal((tokens, q_dim + 2 * kv_dim)).astype(np.float32)
    qkv[:, :q_dim] *= 3
    kc = rng.standard_normal((ctx, kv_dim)).astype(np.float16).astype(np.float32)
    vc = rng.standard_normal((ctx, kv_dim)).astype(np.float16).astype(np.float32)
    out = gpu.buffer(tokens * q_dim * 4)
    scores = gpu.buffer(attention_scratch_bytes(tokens + 1, n_head, ctx, hd))  # a larger step's scratch
    state = _state(gpu, pos0, tokens)
    dims = {"n_head": n_head, "head_dim": hd, "ctx": ctx, "tokens": tokens}
    split = kernels.attention(
        gpu.upload(qkv), _cache(gpu, kernels, kc), _cache(gpu, kernels, vc), out, scores, state,
        n_kv=n_kv, scale=float(1 / np.sqrt(hd)), split=True, **dims,
    )  # fmt: skip
    assert split.groups == (n_head, tokens, -(-ctx // ATTENTION_CHUNK))
    kernels.run([split, kernels.attention_combine(scores, out, state, **dims)])
    got = gpu.read(out, np.float32, tokens * q_dim).reshape(tokens, n_head, hd)
    _close(got, _attention_reference(qkv, kc, vc, pos0, tokens, n_head, n_kv, hd))


def test_attention_split_refuses_a_scratch_without_room_for_partials(gpu, kv_kernels):
    """A scratch sized for scores alone would have partial results overwrite another token's scores."""
    buf = gpu.buffer(64)
    with pytest.raises(ValueError, match="attention scratch"):
        kv_kernels.attention(
            buf, buf, buf, buf, gpu.buffer(2 * 300 * 4), buf,
            n_head=2, n_kv=1, head_dim=8, ctx=300, scale=1.0, split=True,
        )  # fmt: skip


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk-norm"])
@pytest.mark.parametrize(("n_head", "n_kv", "hd", "n_rot"), [(4, 2, 16, 16), (3, 1, 24, 16)])
@pytest.mark.parametrize(
    ("pos", "tokens", "ctx", "split"),
    [(37, 1, 48, False), (300, 1, 520, True), (30, 3, 48, False), (0, 2, 8, False), (254, 4, 520, True)],
    ids=["decode", "decode-split", "prefill", "prefill-from-0", "prefill-split-across-a-chunk-edge"],
)
def test_attention_can_rotate_and_store_the_step_itself(
    gpu, kv_kernels, rng, neox, qk_norm, n_head, n_kv, hd, n_rot, pos, tokens, ctx, split
):
    """rope_store's work inside attention, for a step of ``tokens`` tokens at pos..: the output and cache of the
    two dispatches. The step's earlier keys are normed and rotated from the q/k/v rows (the cache at those
    positions is being written by other workgroups); split along the sequence, only the chunk holding a token's
    own position stores its k, v (the prefill-split case spans positions 254..257, across a chunk edge)."""
    from anyformer_gguf_gpu.kernels import AttentionRope, attention_scratch_bytes

    kernels = kv_kernels
    base, eps = 10000.0, 1e-6
    q_dim, kv_dim = n_head * hd, n_kv * hd
    qkv = rng.standard_normal((tokens, q_dim + 2 * kv_dim)).astype(np.float32)
    norm = rng.standard_normal(2 * hd).astype(np.float32)
    kc = rng.standard_normal((ctx, kv_dim)).astype(np.float16).astype(np.float32)
    vc = rng.standard_normal((ctx, kv_dim)).astype(np.float16).astype(np.float32)
    kc[pos:], vc[pos:] = 0, 0
    k_cache, v_cache = _cache(gpu, kernels, kc), _cache(gpu, kernels, vc)
    out = gpu.buffer(tokens * q_dim * 4)
    table, norm_buf = gpu.upload(cos_sin_table(ctx, n_rot, base)), gpu.upload(norm)
    rope = AttentionRope(table, norm_buf, n_rot, neox, qk_norm, eps)
    scores, state = gpu.buffer(attention_scratch_bytes(tokens, n_head, ctx, hd)), _state(gpu, pos, tokens)
    dims = {"n_head": n_head, "head_dim": hd, "ctx": ctx, "tokens": tokens}
    dispatch = kernels.attention_with_rope(
        rope, gpu.upload(qkv), k_cache, v_cache, out, scores, state,
        n_kv=n_kv, scale=float(1 / np.sqrt(hd)), split=split, **dims,
    )  # fmt: skip
    combine = [kernels.attention_combine(scores, out, state, **dims)] if split else []
    kernels.run([dispatch, *combine])
    q = qkv[:, :q_dim].reshape(tokens, n_head, hd)
    k = qkv[:, q_dim : q_dim + kv_dim].reshape(tokens, n_kv, hd)
    v = qkv[:, q_dim + kv_dim :]
    if qk_norm:
        q, k = _rms(q, norm[:hd], eps), _rms(k, norm[hd:], eps)
    at = np.arange(pos, pos + tokens, dtype=np.float64)
    q, k = rope_reference(q, at, n_rot, base, neox), rope_reference(k, at, n_rot, base, neox)
    keys, values = kc.astype(np.float64), vc.astype(np.float64)
    keys[pos : pos + tokens], values[pos : pos + tokens] = k.reshape(tokens, -1), v
    got = gpu.read(out, np.float32, tokens * q_dim).reshape(tokens, n_head, hd)
    group = n_head // n_kv
    for t in range(tokens):
        for h in range(n_head):
            span = slice((h // group) * hd, (h // group + 1) * hd)
            s = keys[: pos + t + 1, span] @ q[t, h] / np.sqrt(hd)
            p = np.exp(s - s.max())
            _close(got[t, h], (p / p.sum()) @ values[: pos + t + 1, span], rel=2e-4 if kernels.kv_f16 else 2e-5)
    cache_k = _read_cache(gpu, kernels, k_cache, ctx * kv_dim).reshape(ctx, kv_dim)
    cache_v = _read_cache(gpu, kernels, v_cache, ctx * kv_dim).reshape(ctx, kv_dim)
    tol = {"rtol": 1e-3, "atol": 1e-3} if kernels.kv_f16 else {"rtol": 0, "atol": 1e-5}
    np.testing.assert_allclose(cache_k[pos : pos + tokens], k.reshape(tokens, -1), **tol)
    np.testing.assert_allclose(cache_v[pos : pos + tokens], v, **tol)
    np.testing.assert_array_equal(cache_k[:pos], kc[:pos])
    np.testing.assert_array_equal(cache_k[pos + tokens :], kc[pos + tokens :])


def test_swiglu(gpu, kernels, rng):
    n, tokens = 77, 2
    gu = rng.standard_normal((tokens, 2 * n)).astype(np.float32) * 4
    y = gpu.buffer(tokens * n * 4)
    kernels.run([kernels.swiglu(gpu.upload(gu), y, n, tokens=tokens)])
    g, u = gu[:, :n].astype(np.float64), gu[:, n:]
    _close(gpu.read(y, np.float32, tokens * n).reshape(tokens, n), g / (1 + np.exp(-g)) * u)


@pytest.mark.parametrize("n", [1, 255, 1000, 4099])
def test_argmax_writes_the_next_id_on_the_gpu(gpu, kernels, rng, n):
    logits = rng.standard_normal(n).astype(np.float32)
    best = int(rng.integers(0, n))
    logits[best] = 10.0
    ids = gpu.upload(np.zeros(16, dtype=np.uint32))
    kernels.run([kernels.argmax(gpu.upload(logits), ids, _state(gpu, 5, 3), n)])
    got = gpu.read(ids, np.uint32, 16)
    assert got[8] == best and not np.delete(got, 8).any()


def test_argmax_breaks_ties_to_the_lowest_index(gpu, kernels):
    logits = np.zeros(1000, dtype=np.float32)
    logits[[901, 333, 640]] = 2.0
    ids = gpu.upload(np.zeros(4, dtype=np.uint32))
    kernels.run([kernels.argmax(gpu.upload(logits), ids, _state(gpu, 0, 1), 1000)])
    assert gpu.read(ids, np.uint32, 4)[1] == 333


def test_a_buffer_over_the_gpus_limit_is_out_of_memory(gpu):
    from anyformer.plugin import AnyformerError, ErrorCode

    with pytest.raises(AnyformerError) as info:
        gpu.buffer(gpu.limits["max-buffer-size"] + 1, label="too big")
    assert info.value.code is ErrorCode.OUT_OF_MEMORY and "too big" in str(info.value)


def test_wgpu_failures_become_anyformer_errors(gpu):
    """A validation error from wgpu (here: a shader that does not compile) is BACKEND_CRASHED, not a traceback."""
    from anyformer.plugin import AnyformerError, ErrorCode
    from anyformer_gguf_gpu.gpu import gpu_errors

    with pytest.raises(AnyformerError) as info, gpu_errors("compiling a broken kernel"):
        gpu.device.create_shader_module(code="fn main( {")
    assert info.value.code is ErrorCode.BACKEND_CRASHED and "compiling a broken kernel" in str(info.value)


def _host_sample(logits, temperature, top_k, top_p, seed, step):
    """The sample kernel's rule on the host: top-k by (value, lower index), softmax, top-p cut, the seeded draw."""
    from anyformer_gguf_gpu.kernels import uniform01

    order = np.lexsort((np.arange(len(logits)), -logits))[:top_k]
    mass = np.exp((logits[order] - logits[order[0]]) / np.float32(temperature)).astype(np.float32)
    kept = min(int(np.searchsorted(np.cumsum(mass / mass.sum()), top_p)) + 1, len(order))
    run = np.cumsum(mass[:kept])
    goal = uniform01(seed, step) * run[-1]
    return int(order[min(int(np.searchsorted(run, goal, side="right")), kept - 1)])


@pytest.mark.parametrize("trial", range(6))
def test_sample_draws_the_seeded_top_k_top_p_pick(gpu, kernels, rng, trial):
    from anyformer_gguf_gpu.kernels import sampling_block

    n = int(rng.integers(50, 3000)) + trial
    logits = (rng.standard_normal(n) * 2).astype(np.float32)
    temperature, top_k, top_p = float(rng.uniform(0.5, 1.5)), int(rng.integers(1, 64)), float(rng.uniform(0.5, 1))
    seed = int(rng.integers(0, 2**32))
    ids = gpu.upload(np.zeros(16, dtype=np.uint32))
    block = gpu.upload(sampling_block(temperature, top_k, top_p, seed))
    kernels.run([kernels.sample(gpu.upload(logits), ids, _state(gpu, 5, 3), block, n)])
    assert gpu.read(ids, np.uint32, 16)[8] == _host_sample(logits, temperature, top_k, top_p, seed, 8)


def test_sample_with_top_k_one_is_the_argmax(gpu, kernels, rng):
    from anyformer_gguf_gpu.kernels import sampling_block

    logits = rng.standard_normal(777).astype(np.float32)
    ids = gpu.upload(np.zeros(4, dtype=np.uint32))
    block = gpu.upload(sampling_block(2.0, 1, 1.0, 99))
    kernels.run([kernels.sample(gpu.upload(logits), ids, _state(gpu, 0, 1), block, 777)])
    assert gpu.read(ids, np.uint32, 4)[1] == int(np.argmax(logits))


@pytest.mark.parametrize("fmt", [Q4_1, F32], ids=lambda f: f.name)
@pytest.mark.parametrize("sampler", ["argmax", "sample"])
def test_samplers_can_embed_the_id_they_pick(gpu, kernels, rng, fmt, sampler):
    """The next decode step's input, written by the sampler: the picked id's dequantised embedding row
    (block rows and a float row whose length is not a multiple of 8), the rest of the buffer untouched."""
    from anyformer_gguf_gpu.kernels import EmbedNext, sampling_block

    rows, cols, n = 300, _cols_for(fmt, 3), 300
    raw = random_blocks(fmt, rows * cols, rng)
    table = dequantize(raw, fmt.ggml_type).reshape(rows, cols)
    logits = rng.standard_normal(n).astype(np.float32)
    start = rng.standard_normal(cols + 7).astype(np.float32)
    ids, out = gpu.buffer(64), gpu.upload(start)
    embed = EmbedNext(gpu.upload(raw), fmt, rows, cols, out)
    state = _state(gpu, 5, 3)
    if sampler == "argmax":
        dispatch = kernels.argmax(gpu.upload(logits), ids, state, n, embed=embed)
    else:
        block = gpu.upload(sampling_block(0.8, 1, 1.0, 7))  # top-k 1: the argmax
        dispatch = kernels.sample(gpu.upload(logits), ids, state, block, n, embed=embed)
    kernels.run([dispatch])
    picked = int(gpu.read(ids, np.uint32, 16)[8])
    assert picked == int(np.argmax(logits))
    got = gpu.read(out, np.float32, cols + 7)
    np.testing.assert_array_equal(got[:cols], table[picked].astype(np.float32))
    np.testing.assert_array_equal(got[cols:], start[cols:])


def test_moe_combine_adds_each_tokens_weighted_rows_in_table_order(gpu, kernels, rng):
    """Rows packed by expert (any order), m weighted rows per token added to that token's residual: numpy's sum."""
    from anyformer_gguf_gpu.kernels import combine_table

    n, tokens, m, packed = 77, 5, 3, 17
    src = rng.standard_normal((packed, n)).astype(np.float32)
    h = rng.standard_normal((tokens, n)).astype(np.float32)
    rows = rng.integers(0, packed, size=(tokens, m))
    weights = rng.standard_normal((tokens, m)).astype(np.float32)
    out = gpu.upload(h)
    table = gpu.upload(combine_table(rows, weights))
    kernels.run([kernels.moe_combine(gpu.upload(src), table, out, n, m, tokens=tokens)])
    want = h + np.einsum("tm,tmn->tn", weights.astype(np.float64), src[rows].astype(np.float64))
    _close(gpu.read(out, np.float32, tokens * n).reshape(tokens, n), want)


def test_moe_combine_of_one_unit_row_adds_a_vector_exactly(gpu, kernels, rng):
    """y += v (diskformer's cpu_experts adds the CPU experts' sum so): one row of weight 1 is numpy's f32 sum, bit
    for bit, and leaves the rest of y alone."""
    from anyformer_gguf_gpu.kernels import combine_table

    n = 133
    v = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n + 5).astype(np.float32)
    out = gpu.upload(y)
    table = gpu.upload(combine_table(np.zeros((1, 1), dtype=np.int64), np.ones((1, 1))))
    kernels.run([kernels.moe_combine(gpu.upload(v), table, out, n, 1, tokens=1)])
    got = gpu.read(out, np.float32, n + 5)
    np.testing.assert_array_equal(got[:n], y[:n] + v)
    np.testing.assert_array_equal(got[n:], y[n:])


def test_combine_table_refuses_rows_and_weights_of_different_shapes():
    from anyformer_gguf_gpu.kernels import combine_table

    with pytest.raises(ValueError):
        combine_table(np.zeros((2, 3), dtype=np.int64), np.zeros((2, 2), dtype=np.float32))
