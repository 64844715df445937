"""A float64 numpy forward pass of the llama-family models, from the GGUF's dequantised weights.

It is the yardstick that separates the engine's own error from llama.cpp's: llama.cpp's CPU build
rounds activations to 8 bits (Q8_0 / Q8_1 blocks) before its quantised dot products, so its logits
differ from exact arithmetic by far more than the engine's f32 sums do.
"""

from __future__ import annotations

import numpy as np

from anyformer_gguf_gpu.config import read_config
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.quants import dequantize


def _w(f: GGUFFile, name: str) -> np.ndarray:
    info = f.tensor(name)
    values = dequantize(f.raw(name), info.ggml_type).astype(np.float64)
    return values.reshape(tuple(reversed(info.dims))) if len(info.dims) > 1 else values


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, neox: bool) -> np.ndarray:
    out = x.copy()
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    ang = pos[:, None, None] * inv[None, None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    if neox:
        a, b = x[..., : n_rot // 2], x[..., n_rot // 2 : n_rot]
        out[..., : n_rot // 2], out[..., n_rot // 2 : n_rot] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2], out[..., 1:n_rot:2] = a * cos - b * sin, a * sin + b * cos
    return out


def forward(path: str, ids: list[int]) -> np.ndarray:
    """Logits (tokens × vocab) of every position of ``ids``, causal, in float64."""
    with GGUFFile(path) as f:
        c = read_config(f.header)
        n = len(ids)
        pos = np.arange(n, dtype=np.float64)
        h = _w(f, "token_embd.weight")[ids]
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for i in range(c.n_layer):
            p = f"blk.{i}."
            x = _rms(h, _w(f, p + "attn_norm.weight"), c.eps)
            q = (x @ _w(f, p + "attn_q.weight").T).reshape(n, c.n_head, c.head_dim)
            k = (x @ _w(f, p + "attn_k.weight").T).reshape(n, c.n_kv, c.head_dim)
            v = (x @ _w(f, p + "attn_v.weight").T).reshape(n, c.n_kv, c.head_dim)
            if c.qk_norm:
                q = _rms(q, _w(f, p + "attn_q_norm.weight"), c.eps)
                k = _rms(k, _w(f, p + "attn_k_norm.weight"), c.eps)
            q = _rope(q, pos, c.n_rot, c.rope_base, c.rope_neox)
            k = _rope(k, pos, c.n_rot, c.rope_base, c.rope_neox)
            group = c.n_head // c.n_kv
            out = np.empty((n, c.n_head, c.head_dim))
            for hd in range(c.n_head):
                s = q[:, hd] @ k[:, hd // group].T / np.sqrt(c.head_dim) + mask
                pr = np.exp(s - s.max(axis=1, keepdims=True))
                out[:, hd] = (pr / pr.sum(axis=1, keepdims=True)) @ v[:, hd // group]
            h = h + out.reshape(n, -1) @ _w(f, p + "attn_output.weight").T
            x = _rms(h, _w(f, p + "ffn_norm.weight"), c.eps)
            g = x @ _w(f, p + "ffn_gate.weight").T
            u = x @ _w(f, p + "ffn_up.weight").T
            h = h + (g / (1 + np.exp(-g)) * u) @ _w(f, p + "ffn_down.weight").T
        x = _rms(h, _w(f, "output_norm.weight"), c.eps)
        head = _w(f, "token_embd.weight" if c.tied_output else "output.weight")
        return x @ head.T
