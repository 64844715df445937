"""The MoE forward pass (qwen3moe, qwen2moe, bailingmoe, bailingmoe2) on the CPU in numpy: dense weights resident
as stored, routed experts from the cache.

Per layer, as llama.cpp's graphs for these architectures: RMSNorm, q/k/v projections (with biases
in qwen2moe), per-head RMSNorm of q and k (qwen3moe), NEOX rotary embedding, grouped-query causal
attention over the KV cache, the output projection added to the residual; then RMSNorm, the router
(softmax over all experts, top-k, the k weights renormalised to sum to 1 where the architecture
says so), each selected expert's SwiGLU FFN weighted and summed, plus the shared expert's SwiGLU
scaled by sigmoid(x · gate_inp_shexp) where there is one (qwen2moe), added to the residual.
bailingmoe2 (Ling 2.0) reads q, k and v from one fused matrix, rotates part of each head, runs its
leading layers as dense SwiGLU FFNs and routes as :mod:`anyformer_diskformer.compute.routing` says (sigmoid
probabilities, a selection bias, expert groups). Arithmetic is float32, as llama.cpp's CPU build.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_diskformer.arch.moe_config import MoEConfig
from anyformer_diskformer.blas_threads import one_blas_thread
from anyformer_diskformer.cache.expert_cache import ExpertCache
from anyformer_diskformer.cache.expert_reader import ExpertSlices
from anyformer_diskformer.cache.prefetch import likely_experts
from anyformer_diskformer.compute.dense_weights import DenseWeights
from anyformer_diskformer.compute.expert_compute import ExpertRunner
from anyformer_diskformer.compute.routing import route_layer, selection_scores
from anyformer_diskformer.trace import TraceWriter
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.transformer import cos_sin_table


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return (x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w).astype(np.float32)


def _silu(x: np.ndarray) -> np.ndarray:
    return (x / (1.0 + np.exp(-x))).astype(np.float32)


def _swiglu(weights: DenseWeights, x: np.ndarray, prefix: str, suffix: str) -> np.ndarray:
    """A resident SwiGLU FFN: down(silu(gate(x)) * up(x)) of tensors ``{prefix}ffn_{part}{suffix}.weight``."""
    gate = _silu(weights.product(x, f"{prefix}ffn_gate{suffix}.weight"))
    hidden = gate * weights.product(x, f"{prefix}ffn_up{suffix}.weight")
    return weights.product(hidden, f"{prefix}ffn_down{suffix}.weight")


class CpuMoEEngine:
    """A loaded qwen3moe or qwen2moe model on the CPU: dense weights as stored, an f32 KV cache of ``ctx`` tokens."""

    def __init__(
        self,
        gguf: GGUFFile,
        config: MoEConfig,
        cache: ExpertCache[ExpertSlices],
        ctx: int,
        trace: TraceWriter | None = None,
    ) -> None:
        self.config = config
        self.cache = cache
        self.trace = trace
        if trace is not None:
            cache.take_accesses()  # start recording
        self.ctx = ctx
        # Held as stored and dequantised per use: float32 copies would take ~4x (Q4_K: ~7x) the memory.
        self._w = DenseWeights(gguf, config.n_layer)
        self._head = "token_embd.weight" if config.tied_output else "output.weight"
        self._rope = cos_sin_table(ctx, config.n_rot, config.rope_base)
        # KV rows for the layers that attend only (qwen35moe's delta nets keep states instead).
        attending = [i for i in range(config.n_layer) if not config.is_recurrent(i)]
        #: Each attending layer's row in the KV arrays.
        self._kv_row = {layer: row for row, layer in enumerate(attending)}
        shape = (len(attending), ctx, config.n_kv, config.head_dim)
        self._k = np.zeros(shape, dtype=np.float32)
        self._v = np.zeros(shape, dtype=np.float32)
        self._runner = ExpertRunner(1, config.n_embd, config.n_ff_exp, self._expert_activation())
        self._w.kernels = self._runner

    def _expert_activation(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """The routed experts' gate activation (None: SiLU); an architecture with another overrides this."""
        return None

    def set_threads(self, threads: int) -> None:
        """Compute a layer's experts and the large dense products on ``threads`` threads (1, the default: this
        thread)."""
        self._runner.close()
        self._runner = ExpertRunner(threads, self.config.n_embd, self.config.n_ff_exp, self._expert_activation())
        self._w.kernels = self._runner

    def release(self) -> None:
        """Stop the expert threads (the cache is closed by its owner); safe to call twice."""
        self._runner.close()

    @property
    def held_bytes(self) -> int:
        """Host bytes of dense weights and the KV cache (the expert cache counts its own)."""
        return self._w.nbytes + self._k.nbytes + self._v.nbytes

    def _rotate(self, x: np.ndarray, start: int) -> np.ndarray:
        """Rotary embedding of the first ``n_rot`` dims of each head: NEOX pairs (i, i + n_rot/2), or adjacent
        pairs (2i, 2i + 1) where the architecture uses the original form."""
        n, half = x.shape[0], self.config.n_rot // 2
        table = self._rope[start : start + n]
        cos, sin = table[:, None, :, 0], table[:, None, :, 1]
        out = x.copy()
        if self.config.rope_neox:
            a, b = x[..., :half], x[..., half : 2 * half]
            out[..., :half] = a * cos - b * sin
            out[..., half : 2 * half] = a * sin + b * cos
        else:
            a, b = x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]
            out[..., 0 : 2 * half : 2] = a * cos - b * sin
            out[..., 1 : 2 * half : 2] = a * sin + b * cos
        return out

    def _project(self, name: str, x: np.ndarray) -> np.ndarray:
        """``x @ W.T``, plus the bias where the model has one."""
        y = self._w.product(x, name + ".weight")
        bias = self._w.optional_vector(name + ".bias")
        return y + bias if bias is not None else y

    def _attention(self, layer: int, x: np.ndarray, start: int) -> np.ndarray:
        c, p = self.config, f"blk.{layer}."
        n = x.shape[0]
        if c.fused_qkv:
            qkv = self._w.product(x, p + "attn_qkv.weight")
            q, k, v = np.split(qkv, [c.q_dim, c.q_dim + c.kv_dim], axis=-1)
        else:
            q, k, v = (self._project(p + f"attn_{name}", x) for name in "qkv")
        q, k = q.reshape(n, c.n_head, c.head_dim), k.reshape(n, c.n_kv, c.head_dim)
        v = v.reshape(n, c.n_kv, c.head_dim)
        if c.qk_norm:
            q = _rms(q, self._w.vector(p + "attn_q_norm.weight"), c.eps)
            k = _rms(k, self._w.vector(p + "attn_k_norm.weight"), c.eps)
        q, k = self._rotate(q, start), self._rotate(k, start)
        out = self._causal_attention(layer, q, k, v, start)
        return self._w.product(out.reshape(n, -1), p + "attn_output.weight")

    def _causal_attention(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int) -> np.ndarray:
        """Store ``k``, ``v`` (tokens, n_kv, head_dim) at ``start`` in ``layer``'s cache and return each query's
        softmax(q k^T / sqrt(head_dim)) v over the cached keys it may see, (tokens, n_head, head_dim)."""
        c, n = self.config, q.shape[0]
        end = start + n
        row = self._kv_row[layer]
        self._k[row, start:end] = k
        self._v[row, start:end] = v
        keys, values = self._k[row, :end], self._v[row, :end]
        group = c.n_head // c.n_kv
        # Query i sits at position start + i and sees keys 0 .. start + i.
        mask = np.where(np.arange(end)[None, :] > (start + np.arange(n))[:, None], -np.inf, 0.0).astype(np.float32)
        out = np.empty((n, c.n_head, c.head_dim), dtype=np.float32)
        scale = np.float32(1.0 / np.sqrt(c.head_dim))
        for h in range(c.n_head):
            s = (q[:, h] @ keys[:, h // group].T) * scale + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, h] = (s / s.sum(axis=1, keepdims=True)) @ values[:, h // group]
        return out

    def _experts(self, layer: int, x: np.ndarray) -> np.ndarray:
        c, p = self.config, f"blk.{layer}."
        if not c.is_moe_layer(layer):
            return _swiglu(self._w, x, p, "")
        router = self._w.product(x, p + "ffn_gate_inp.weight")
        chosen, weights = route_layer(c, router, self._w.optional_vector(p + "exp_probs_b.bias"))
        # Each expert the batch routes to is fetched once and applied to every token that chose it.
        out = self._runner.run(self.cache, layer, x, chosen, weights)
        if c.n_ff_shexp:
            shared = _swiglu(self._w, x, p, "_shexp")
            if c.shexp_gated:
                gate = 1.0 / (1.0 + np.exp(-(x @ self._w.vector(p + "ffn_gate_inp_shexp.weight"))))
                shared = gate[:, None].astype(np.float32) * shared
            out += shared
        return out

    def checkpoint(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """A copy of the keys and values of positions 0..n-1 (see :meth:`restore`)."""
        return self._k[:, :n].copy(), self._v[:, :n].copy()

    def restore(self, saved: tuple[np.ndarray, np.ndarray], n: int) -> None:
        """Put back the first ``n`` positions of a :meth:`checkpoint`: the next step may start at position n."""
        self._k[:, :n] = saved[0][:, :n]
        self._v[:, :n] = saved[1][:, :n]

    def _guess(self, layer: int, h: np.ndarray) -> None:
        """Have the prefetcher read ``layer``'s likely experts: its router on the current residual."""
        prefetcher = self.cache.prefetcher
        if prefetcher is None or layer >= self.config.n_layer or not self.config.is_moe_layer(layer):
            return
        p = f"blk.{layer}."
        x = _rms(h, self._w.vector(p + self.config.ffn_norm + ".weight"), self.config.eps)
        logits = self._w.product(x, p + "ffn_gate_inp.weight")
        scores = selection_scores(self.config, logits, self._w.optional_vector(p + "exp_probs_b.bias"))
        guess = likely_experts(scores, self.config.n_expert_used, prefetcher.width)
        self.cache.expect(layer, guess)
        prefetcher.request(layer, guess, self.cache)
        if not self.config.is_moe_layer(layer - 1):
            # A dense layer (a leading dense block) looks no experts up, so nothing would start the reads before
            # ``layer``'s own lookups: start them now, overlapping the dense MLP.
            prefetcher.start(layer - 1)

    def _check_step(self, ids: list[int], start: int) -> None:
        """``BAD_REQUEST`` for positions past the context or ids outside the vocabulary."""
        if start < 0 or start + len(ids) > self.ctx:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"positions {start}..{start + len(ids)} exceed {self.ctx}")
        if any(not 0 <= t < self.config.n_vocab for t in ids):
            raise AnyformerError(ErrorCode.BAD_REQUEST, "a token id is outside the vocabulary")

    def forward(self, ids: list[int], start: int, *, every: bool = True) -> np.ndarray:
        """Logits for ``ids`` at positions ``start..`` (every token's rows, or the last's); their keys and values
        enter the cache."""
        # The engine's threads split the work; BLAS threads on top of them only contend (see blas_threads).
        with one_blas_thread():
            return self._step(ids, start, every)

    def _step(self, ids: list[int], start: int, every: bool) -> np.ndarray:
        """:meth:`forward`'s computation (an architecture with another layer overrides this)."""
        c = self.config
        self._check_step(ids, start)
        h = self._w.rows("token_embd.weight", ids)
        for layer in range(c.n_layer):
            p = f"blk.{layer}."
            h = h + self._attention(layer, _rms(h, self._w.vector(p + "attn_norm.weight"), c.eps), start)
            x = _rms(h, self._w.vector(p + c.ffn_norm + ".weight"), c.eps)
            self._guess(layer + 1, h)
            h = h + self._experts(layer, x)
        if self.trace is not None:
            self.trace.write(self.cache.take_accesses())
        h = h if every else h[-1:]
        return self._w.product(_rms(h, self._w.vector("output_norm.weight"), c.eps), self._head).astype(np.float32)
