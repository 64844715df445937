"""A float64 numpy forward pass of LFM2 from the GGUF's dequantised weights, written from the architecture.

The definition (llama.cpp's ``lfm2`` graph, and Liquid AI's description of LFM2), per layer:

- ``x = RMSNorm(h) * attn_norm`` (the operator norm);
- a convolution layer (``head_count_kv[layer] == 0``): ``B, C, z = split(in_proj @ x, 3)``; ``u = B * z``;
  ``c[t] = sum_j conv[:, j] * u[t - (L - 1) + j]`` (causal, depthwise, ``L = shortconv.l_cache`` taps,
  zeros before the first token); ``h += out_proj @ (C * c)``;
- an attention layer: q, k, v; each q and k head RMS-normed (``attn_q_norm`` / ``attn_k_norm``), NEOX
  RoPE, causal grouped-query attention scaled by 1/sqrt(head), ``h += attn_output @ o``;
- then ``h += ffn_down @ (silu(ffn_gate @ y) * (ffn_up @ y))`` with ``y = RMSNorm(h) * ffn_norm``.

The logits are ``head @ (RMSNorm(h) * token_embd_norm)``, the head ``output`` or the tied embedding.
"""

from __future__ import annotations

import numpy as np
from numpy_reference import _rms, _rope, _w

from anyformer_gguf_gpu.gguf_file import GGUFFile


def conv_reference(u: np.ndarray, taps: np.ndarray, state: np.ndarray | None = None) -> np.ndarray:
    """The causal depthwise convolution: out[t, c] = sum_j taps[c, j] * [state; u][t + j, c].

    ``u`` is (tokens, channels), ``taps`` (channels, L) with the last tap on the current token, and
    ``state`` the L - 1 inputs before the first token (zeros when None).
    """
    width = taps.shape[1]
    before = np.zeros((width - 1, u.shape[1])) if state is None else state
    padded = np.concatenate([before, u])
    return sum(padded[j : j + u.shape[0]] * taps[:, j] for j in range(width))


def forward(path: str, ids: list[int]) -> np.ndarray:
    """Logits (tokens × vocab) of every position of ``ids``, causal, in float64."""
    with GGUFFile(path) as f:
        kv = f.kv
        n_layer = int(kv["lfm2.block_count"])
        n_head = int(kv["lfm2.attention.head_count"])
        kv_heads = list(kv["lfm2.attention.head_count_kv"])  # type: ignore[call-overload]
        eps = float(kv["lfm2.attention.layer_norm_rms_epsilon"])  # type: ignore[arg-type]
        base = float(kv.get("lfm2.rope.freq_base", 10000.0))  # type: ignore[arg-type]
        n = len(ids)
        pos = np.arange(n, dtype=np.float64)
        h = _w(f, "token_embd.weight")[ids]
        head_dim = h.shape[1] // n_head
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for i in range(n_layer):
            p = f"blk.{i}."
            x = _rms(h, _w(f, p + "attn_norm.weight"), eps)
            if kv_heads[i] == 0:
                b, c, z = np.split(x @ _w(f, p + "shortconv.in_proj.weight").T, 3, axis=1)
                conv = conv_reference(b * z, _w(f, p + "shortconv.conv.weight"))
                h = h + (c * conv) @ _w(f, p + "shortconv.out_proj.weight").T
            else:
                n_kv = kv_heads[i]
                q = (x @ _w(f, p + "attn_q.weight").T).reshape(n, n_head, head_dim)
                k = (x @ _w(f, p + "attn_k.weight").T).reshape(n, n_kv, head_dim)
                v = (x @ _w(f, p + "attn_v.weight").T).reshape(n, n_kv, head_dim)
                q = _rope(_rms(q, _w(f, p + "attn_q_norm.weight"), eps), pos, head_dim, base, True)
                k = _rope(_rms(k, _w(f, p + "attn_k_norm.weight"), eps), pos, head_dim, base, True)
                group = n_head // n_kv
                out = np.empty((n, n_head, head_dim))
                for hd in range(n_head):
                    s = q[:, hd] @ k[:, hd // group].T / np.sqrt(head_dim) + mask
                    pr = np.exp(s - s.max(axis=1, keepdims=True))
                    out[:, hd] = (pr / pr.sum(axis=1, keepdims=True)) @ v[:, hd // group]
                h = h + out.reshape(n, -1) @ _w(f, p + "attn_output.weight").T
            y = _rms(h, _w(f, p + "ffn_norm.weight"), eps)
            g = y @ _w(f, p + "ffn_gate.weight").T
            u = y @ _w(f, p + "ffn_up.weight").T
            h = h + (g / (1 + np.exp(-g)) * u) @ _w(f, p + "ffn_down.weight").T
        x = _rms(h, _w(f, "token_embd_norm.weight"), eps)
        head = _w(f, "output.weight") if f.has("output.weight") else _w(f, "token_embd.weight")
        return x @ head.T
