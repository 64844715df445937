"""Gemma 4's MoE (``gemma4``) on the CPU, as llama.cpp's graph for the architecture.

The embeddings are scaled by sqrt(n_embd). Per layer: RMSNorm; q, k and v (the keys serve as values
where a layer has no v projection); q and k RMS-normalised per head with their weights, v without one;
NEOX rotary over each layer's rotary width (sliding layers with their own base, full layers with the
``rope_freqs`` frequency factors); attention with scale 1 over the KV cache, sliding layers seeing only
the last ``n_swa`` positions (their keys and values a ring of ``n_swa`` rows); the output product
RMS-normalised (``post_attention_norm``) and added to the residual. A MoE layer then adds, after
``post_ffw_norm``, the sum of a dense GELU MLP (``ffn_norm`` before, ``post_ffw_norm_1`` after) and the
routed GELU experts (``pre_ffw_norm_2`` before, ``post_ffw_norm_2`` after), routed by softmax over the
router's logits of the residual RMS-normalised without weight, divided by sqrt(n_embd) and scaled by
``ffn_gate_inp.scale``, the top-k renormalised, each expert's output scaled by ``ffn_down_exps.scale``
where present; a layer without a router runs the dense MLP alone. ``layer_output_scale`` scales the
layer's output; the final logits are soft-capped by tanh where the header says so. GELU is the tanh
form.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from anyformer_diskformer.arch.gemma4_config import Gemma4Config
from anyformer_diskformer.cache.expert_cache import ExpertCache
from anyformer_diskformer.cache.expert_reader import ExpertSlices
from anyformer_diskformer.cache.prefetch import likely_experts
from anyformer_diskformer.compute.routing import route
from anyformer_diskformer.engines.cpu.moe import CpuMoEEngine, _rms
from anyformer_diskformer.trace import TraceWriter
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.transformer import cos_sin_table


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU in its tanh form (ggml's), in float32."""
    x = x.astype(np.float32)
    inner = np.float32(np.sqrt(2.0 / np.pi)) * x * (np.float32(1.0) + np.float32(0.044715) * x * x)
    return (np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))).astype(np.float32)


def _norm(x: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm without a weight."""
    return (x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)).astype(np.float32)


class Gemma4CpuEngine(CpuMoEEngine):
    """A loaded Gemma 4 MoE on the CPU: a KV cache per layer in that layer's head width, a ring of n_swa rows for a
    sliding layer."""

    config: Gemma4Config

    def __init__(
        self,
        gguf: GGUFFile,
        config: Gemma4Config,
        cache: ExpertCache[ExpertSlices],
        ctx: int,
        trace: TraceWriter | None = None,
    ) -> None:
        super().__init__(gguf, config, cache, ctx, trace)
        c = config
        # Per-layer widths: the base class's one-width cache is replaced by one array per layer.
        self._k = np.zeros((0, 0, 0, 0), dtype=np.float32)
        self._v = np.zeros((0, 0, 0, 0), dtype=np.float32)
        # A sliding layer holds a ring of n_swa rows (position p at row p % n_swa), not ctx: its attention reads
        # the ring's keys before storing the step's own (see _layer_keys), so however many tokens a step takes,
        # the window before it (n_swa - 1 positions) is still there: kv_rows(ctx, step=1).
        self.kv_rows = c.kv_rows(ctx)
        self._keys = [
            np.zeros((self.kv_rows[i], c.kv_heads[i], c.head_dims[i]), dtype=np.float32) for i in range(c.n_layer)
        ]
        self._values = [np.zeros_like(k) for k in self._keys]
        factors = self._w.optional_vector("rope_freqs.weight")
        swa_rot = max((c.rots[i] for i in range(c.n_layer) if c.swa[i]), default=2)
        full_factors = factors[: c.n_rot // 2] if factors is not None else None
        self._tables = {
            True: cos_sin_table(ctx, swa_rot, c.rope_base_swa),
            False: cos_sin_table(ctx, c.n_rot, c.rope_base, full_factors),
        }

    @property
    def held_bytes(self) -> int:
        """Host bytes of dense weights and the per-layer KV caches."""
        return self._w.nbytes + sum(k.nbytes + v.nbytes for k, v in zip(self._keys, self._values, strict=True))

    def _rotate_layer(self, x: np.ndarray, start: int, layer: int) -> np.ndarray:
        """NEOX rotary over the layer's first ``rots[layer]`` dims of each head."""
        c = self.config
        half = c.rots[layer] // 2
        table = self._tables[c.swa[layer]][start : start + x.shape[0], :half]
        cos, sin = table[:, None, :, 0], table[:, None, :, 1]
        out = x.copy()
        a, b = x[..., :half], x[..., half : 2 * half]
        out[..., :half] = a * cos - b * sin
        out[..., half : 2 * half] = a * sin + b * cos
        return out

    def _attention(self, layer: int, x: np.ndarray, start: int) -> np.ndarray:
        c, p = self.config, f"blk.{layer}."
        n, d, heads, kv_heads = x.shape[0], c.head_dims[layer], c.heads[layer], c.kv_heads[layer]
        q = self._w.product(x, p + "attn_q.weight").reshape(n, heads, d)
        k = self._w.product(x, p + "attn_k.weight").reshape(n, kv_heads, d)
        v = self._w.product(x, p + "attn_v.weight").reshape(n, kv_heads, d) if c.has_v[layer] else k
        q = self._rotate_layer(_rms(q, self._w.vector(p + "attn_q_norm.weight"), c.eps), start, layer)
        k = self._rotate_layer(_rms(k, self._w.vector(p + "attn_k_norm.weight"), c.eps), start, layer)
        v = _norm(v, c.eps)
        keys, values, first = self._layer_keys(layer, k, v, start)
        where = start + np.arange(n)[:, None]
        seen = first + np.arange(keys.shape[0])[None, :]
        hidden = seen > where
        if c.swa[layer]:
            hidden |= where - seen >= c.n_swa
        mask = np.where(hidden, -np.inf, 0.0).astype(np.float32)
        group = heads // kv_heads
        out = np.empty((n, heads, d), dtype=np.float32)
        for h in range(heads):
            s = q[:, h] @ keys[:, h // group].T + mask  # Gemma 4 scales its scores by 1
            s = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, h] = (s / s.sum(axis=1, keepdims=True)) @ values[:, h // group]
        return self._w.product(out.reshape(n, -1), p + "attn_output.weight")

    def _layer_keys(self, layer: int, k: np.ndarray, v: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Store the step's keys and values (positions ``start``..) and return the keys and values its attention
        reads, with the position of the first: positions 0.. of a full layer; for a sliding layer the ring's
        positions its first token sees (gathered before the step's keys overwrite them), then the step's own."""
        end, rows = start + k.shape[0], self.kv_rows[layer]
        keys, values = self._keys[layer], self._values[layer]
        if not self.config.swa[layer]:
            keys[start:end], values[start:end] = k, v
            return keys[:end], values[:end], 0
        first = max(0, start - self.config.n_swa + 1)
        before = np.arange(first, start) % rows
        seen_k, seen_v = np.concatenate([keys[before], k]), np.concatenate([values[before], v])
        kept = np.arange(max(start, end - rows), end)  # a step longer than the ring keeps its last rows
        keys[kept % rows], values[kept % rows] = k[kept - start], v[kept - start]
        return seen_k, seen_v, first

    def _expert_activation(self) -> Callable[[np.ndarray], np.ndarray] | None:
        return gelu  # Gemma 4's experts gate with GELU (ggml's tanh form)

    def _mlp(self, layer: int, x: np.ndarray) -> np.ndarray:
        p = f"blk.{layer}."
        hidden = gelu(self._w.product(x, p + "ffn_gate.weight")) * self._w.product(x, p + "ffn_up.weight")
        return self._w.product(hidden, p + "ffn_down.weight")

    def _router_logits(self, layer: int, h: np.ndarray) -> np.ndarray:
        c, p = self.config, f"blk.{layer}."
        scaled = _norm(h, c.eps) * np.float32(1.0 / np.sqrt(c.n_embd)) * self._w.vector(p + "ffn_gate_inp.scale")
        return self._w.product(scaled.astype(np.float32), p + "ffn_gate_inp.weight")

    def _routed(self, layer: int, x: np.ndarray, logits: np.ndarray) -> np.ndarray:
        c = self.config
        chosen, weights = route(logits, c.n_expert_used, True)
        scale = self._w.optional_vector(f"blk.{layer}.ffn_down_exps.scale")
        return self._runner.run(self.cache, layer, x, chosen, weights, scale)

    def _guess(self, layer: int, h: np.ndarray) -> None:
        """Have the prefetcher read ``layer``'s likely experts: its router on the current residual."""
        prefetcher = self.cache.prefetcher
        if prefetcher is None or layer >= self.config.n_layer or not self.config.is_moe_layer(layer):
            return
        guess = likely_experts(self._router_logits(layer, h), self.config.n_expert_used, prefetcher.width)
        self.cache.expect(layer, guess)
        prefetcher.request(layer, guess, self.cache)
        if not self.config.is_moe_layer(layer - 1):
            # A dense layer looks no experts up, so nothing would start the reads before ``layer``'s own
            # lookups (by then the guess is stale): start them now, overlapping the dense MLP.
            prefetcher.start(layer - 1)

    def _step(self, ids: list[int], start: int, every: bool) -> np.ndarray:
        """Logits for ``ids`` at positions ``start..`` (every token's rows, or the last's)."""
        c = self.config
        self._check_step(ids, start)
        h = self._w.rows("token_embd.weight", ids) * np.float32(np.sqrt(c.n_embd))
        for layer in range(c.n_layer):
            p = f"blk.{layer}."
            a = self._attention(layer, _rms(h, self._w.vector(p + "attn_norm.weight"), c.eps), start)
            h = h + _rms(a, self._w.vector(p + "post_attention_norm.weight"), c.eps)
            self._guess(layer + 1, h)
            ffn = self._mlp(layer, _rms(h, self._w.vector(p + "ffn_norm.weight"), c.eps))
            if c.is_moe_layer(layer):
                ffn = _rms(ffn, self._w.vector(p + "post_ffw_norm_1.weight"), c.eps)
                x = _rms(h, self._w.vector(p + "pre_ffw_norm_2.weight"), c.eps)
                routed = self._routed(layer, x, self._router_logits(layer, h))
                ffn = ffn + _rms(routed, self._w.vector(p + "post_ffw_norm_2.weight"), c.eps)
            h = h + _rms(ffn, self._w.vector(p + "post_ffw_norm.weight"), c.eps)
            if c.out_scale[layer]:
                h = h * self._w.vector(p + "layer_output_scale.weight")
        if self.trace is not None:
            self.trace.write(self.cache.take_accesses())
        h = h if every else h[-1:]
        logits = self._w.product(_rms(h, self._w.vector("output_norm.weight"), c.eps), self._head)
        if c.softcap:
            logits = np.tanh(logits / np.float32(c.softcap)) * np.float32(c.softcap)
        return logits.astype(np.float32)

    def checkpoint(self, n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:  # type: ignore[override]
        """Copies of every layer's keys and values after a step ending at position ``n``: positions 0..n-1 of a
        full layer, a sliding layer's ring (its last positions; see :meth:`resumes_at`)."""
        rows = [min(n, r) for r in self.kv_rows]
        return [k[:r].copy() for k, r in zip(self._keys, rows, strict=True)], [
            v[:r].copy() for v, r in zip(self._values, rows, strict=True)
        ]

    def restore(self, saved: tuple[list[np.ndarray], list[np.ndarray]], n: int) -> None:  # type: ignore[override]
        """Put back the first ``n`` positions of a :meth:`checkpoint` (a ring whole: the rows of positions from
        ``n`` on are rewritten before any step reads them), where :meth:`resumes_at` allows."""
        for layer, (k, v) in enumerate(zip(*saved, strict=True)):
            rows = len(k) if self.config.swa[layer] else n
            self._keys[layer][:rows] = k[:rows]
            self._values[layer][:rows] = v[:rows]

    def resumes_at(self, length: int, n: int) -> bool:
        """Whether a checkpoint of ``length`` positions can resume at position ``n``: every ring still holds the
        window before ``n``."""
        return self.config.ring_resumes(self.ctx, 1, length, n)
