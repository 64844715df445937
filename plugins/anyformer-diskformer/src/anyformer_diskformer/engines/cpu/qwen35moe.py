"""qwen35moe (Qwen3.5/3.6 MoE) on the CPU: gated delta-net layers between gated full-attention layers.

As llama.cpp's graph for the architecture. A delta-net layer projects the normalised residual to
q, k, v (one matrix) and an output gate z; q, k and v pass through a causal depthwise convolution
over the last ``ssm_conv`` tokens (no bias) and SiLU; q and k are L2-normalised per head
(x / sqrt(Σx² + eps)) and tiled over the value heads (value head h reads key head h mod the key
heads); each value head keeps a state matrix S updated per token by the gated delta rule

    S ← exp(g) · S;  S ← S + β · (v − S k) kᵀ;  o = S q / sqrt(head)

with β = sigmoid(x · ssm_beta) and g = ssm_a · softplus(x · ssm_alpha + ssm_dt) (ssm_a holds
−exp(A_log)); o is RMS-normalised per head (ssm_norm), times silu(z), and projected by ssm_out. A
full-attention layer's q projection gives each head's query and, beside it, a gate: q and k are
RMS-normalised per head, rotated (interleaved multi-section rotary: for text every section but the
fourth turns by the position, the fourth by 0), attention runs over the KV cache, and its output is
scaled by sigmoid(gate) before the output product. Both add to the residual; the FFN (routed experts
and the sigmoid-gated shared expert, as qwen2moe's) follows the ``post_attention_norm``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anyformer_diskformer.arch.moe_config import MoEConfig
from anyformer_diskformer.cache.expert_cache import ExpertCache
from anyformer_diskformer.cache.expert_reader import ExpertSlices
from anyformer_diskformer.engines.cpu.moe import CpuMoEEngine, _rms, _silu
from anyformer_diskformer.trace import TraceWriter
from anyformer_gguf_gpu.gguf_file import GGUFFile


def imrope_turns(n_pairs: int, sections: tuple[int, ...]) -> np.ndarray:
    """Which rotary pairs turn with a text token's position under interleaved multi-section rotary.

    Pair i falls in sector i mod Σsections; sectors 3j, 3j+1, 3j+2 take the first, second and third
    positions while j is below that section's count, every other sector the fourth, which is 0 for text.
    """
    total = sum(sections)
    out = np.zeros(n_pairs, dtype=bool)
    for i in range(n_pairs):
        sector = i % total
        kind = sector % 3
        out[i] = sector < 3 * sections[kind]
    return out


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x).astype(np.float32)


class HybridCpuEngine(CpuMoEEngine):
    """A loaded qwen35moe model on the CPU: KV caches for its attention layers, states for its delta nets."""

    def __init__(
        self,
        gguf: GGUFFile,
        config: MoEConfig,
        cache: ExpertCache[ExpertSlices],
        ctx: int,
        trace: TraceWriter | None = None,
    ) -> None:
        super().__init__(gguf, config, cache, ctx, trace)
        if config.rope_sections:
            turns = imrope_turns(config.n_rot // 2, config.rope_sections)
            self._rope[:, ~turns, 0] = 1.0  # cos 0
            self._rope[:, ~turns, 1] = 0.0  # sin 0
        c = config
        self._conv_width = 2 * c.ssm_k_heads * c.ssm_head + c.ssm_v_heads * c.ssm_head
        self._conv: dict[int, np.ndarray] = {}
        self._state: dict[int, np.ndarray] = {}
        self._reset_states()

    def _reset_states(self) -> None:
        c = self.config
        for layer in range(c.n_layer):
            if c.is_recurrent(layer):
                self._conv[layer] = np.zeros((c.ssm_conv - 1, self._conv_width), dtype=np.float32)
                self._state[layer] = np.zeros((c.ssm_v_heads, c.ssm_head, c.ssm_head), dtype=np.float32)

    @property
    def held_bytes(self) -> int:
        """Host bytes of dense weights, the KV cache and the delta nets' states."""
        states = sum(a.nbytes for a in self._conv.values()) + sum(a.nbytes for a in self._state.values())
        return super().held_bytes + states

    def _attention(self, layer: int, x: np.ndarray, start: int) -> np.ndarray:
        if self.config.is_recurrent(layer):
            return self._delta_net(layer, x, start)
        return self._gated_attention(layer, x, start)

    def _gated_attention(self, layer: int, x: np.ndarray, start: int) -> np.ndarray:
        c, p = self.config, f"blk.{layer}."
        n = x.shape[0]
        both = self._w.product(x, p + "attn_q.weight").reshape(n, c.n_head, 2 * c.head_dim)
        q, gate = both[..., : c.head_dim], both[..., c.head_dim :]
        k = self._w.product(x, p + "attn_k.weight").reshape(n, c.n_kv, c.head_dim)
        v = self._w.product(x, p + "attn_v.weight").reshape(n, c.n_kv, c.head_dim)
        q = self._rotate(_rms(q, self._w.vector(p + "attn_q_norm.weight"), c.eps), start)
        k = self._rotate(_rms(k, self._w.vector(p + "attn_k_norm.weight"), c.eps), start)
        out = self._causal_attention(layer, q, k, v, start) * (1.0 / (1.0 + np.exp(-gate)))
        return self._w.product(out.reshape(n, -1).astype(np.float32), p + "attn_output.weight")

    def _delta_net(self, layer: int, x: np.ndarray, start: int) -> np.ndarray:
        c, p = self.config, f"blk.{layer}."
        if start == 0:
            # A sequence from the start: no earlier token feeds the convolution or the state.
            self._conv[layer][:] = 0.0
            self._state[layer][:] = 0.0
        n, head, hk, hv = x.shape[0], c.ssm_head, c.ssm_k_heads, c.ssm_v_heads
        mixed = self._w.product(x, p + "attn_qkv.weight")
        z = self._w.product(x, p + "attn_gate.weight").reshape(n, hv, head)
        beta = 1.0 / (1.0 + np.exp(-self._w.product(x, p + "ssm_beta.weight")))
        alpha = self._w.product(x, p + "ssm_alpha.weight") + self._w.vector(p + "ssm_dt.bias")
        decay = np.exp(_softplus(alpha) * self._w.vector(p + "ssm_a"))
        # Causal depthwise convolution over the kept inputs and these; the kernel's last tap is the newest token.
        kernel = self._w.rows(p + "ssm_conv1d.weight", list(range(self._conv_width)))  # (channels, width)
        window = np.concatenate([self._conv[layer], mixed], axis=0)
        width = c.ssm_conv
        conv = np.stack([(window[t : t + width] * kernel.T).sum(axis=0) for t in range(n)])
        self._conv[layer] = window[-(width - 1) :].copy()
        conv = _silu(conv.astype(np.float32))
        keys = hk * head
        q = conv[:, :keys].reshape(n, hk, head)
        k = conv[:, keys : 2 * keys].reshape(n, hk, head)
        v = conv[:, 2 * keys :].reshape(n, hv, head)
        q = q / np.sqrt((q * q).sum(axis=-1, keepdims=True) + c.eps)
        k = k / np.sqrt((k * k).sum(axis=-1, keepdims=True) + c.eps)
        tiled = np.arange(hv) % hk  # value head h reads key head h mod hk
        q, k = q[:, tiled] / np.float32(np.sqrt(head)), k[:, tiled]
        state = self._state[layer]
        out = np.empty((n, hv, head), dtype=np.float32)
        for t in range(n):
            state *= decay[t][:, None, None]
            recalled = np.einsum("hij,hj->hi", state, k[t])
            delta = (v[t] - recalled) * beta[t][:, None]
            state += delta[:, :, None] * k[t][:, None, :]
            out[t] = np.einsum("hij,hj->hi", state, q[t])
        normed = _rms(out, self._w.vector(p + "ssm_norm.weight"), c.eps) * _silu(z)
        return self._w.product(normed.reshape(n, -1).astype(np.float32), p + "ssm_out.weight")

    def checkpoint(self, n: int) -> tuple[Any, ...]:
        """The KV of positions 0..n-1 and every delta net's state after them (see :meth:`restore`)."""
        keys, values = super().checkpoint(n)
        conv = {k: v.copy() for k, v in self._conv.items()}
        state = {k: v.copy() for k, v in self._state.items()}
        return keys, values, conv, state, n

    #: A delta net's state sums every token before it: a checkpoint resumes only at its own length.
    resumes_only_whole = True

    def restore(self, saved: tuple[Any, ...], n: int) -> None:  # type: ignore[override]
        """Put back a :meth:`checkpoint` of exactly ``n`` positions; the next step starts at position n."""
        keys, values, conv, state, length = saved
        if n != length:
            raise ValueError(f"a delta-net checkpoint of {length} positions cannot resume at {n}")
        super().restore((keys, values), n)
        for layer, value in conv.items():
            self._conv[layer] = value.copy()
        for layer, value in state.items():
            self._state[layer] = value.copy()
