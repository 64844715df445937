"""Gemma 4's MoE (``gemma4``) on wgpu: the graph of :mod:`~anyformer_diskformer.engines.cpu.gemma4` with the GPU
engine's dense weights, KV cache and expert slots.

Per layer, in one submission: q, k and v (k's weights again in v's place where the layer has no v
projection) with the attention norm fused into the product; rope_store norms q and k with their
weights, rotates them (NEOX, over the layer's rotary width, from the sliding or the full layers'
table) and stores k and v, v RMS-normalised without a weight; attention at scale 1, a sliding layer
seeing its last ``n_swa`` keys; the output product into a buffer of its own whose RMSNorm
(``post_attention_norm``) is added to the residual. Then the dense GELU MLP (``ffn_norm`` fused into
gate and up) and, on a MoE layer, the router: its input normalised without weight, times
``ffn_gate_inp.scale`` / sqrt(n_embd), folded into the product's norm weights; the next layer's
router on the same residual is the prefetcher's guess (a dense layer before a MoE layer submits and reads
back that guess alone, and starts its reads). The host routes as the CPU engine (softmax,
top-k, renormalised), and the chosen experts run at the start of the next submission: gate and up
normalise the residual with ``pre_ffw_norm_2`` themselves, the router weight and the expert's
``ffn_down_exps.scale`` folded into up's norm weights, and each down product (GELU-gated) adds into
a buffer zeroed for the layer. Three RMSNorms finish the layer: the MLP's (``post_ffw_norm_1``) plus
the experts' (``post_ffw_norm_2``), then that sum's (``post_ffw_norm``) added to the residual and
scaled by ``layer_output_scale``. A layer without a router adds its MLP's norm alone, with nothing
read back. The embeddings are scaled by sqrt(n_embd) in the lookup, and the final soft-cap (a tanh
over the vocabulary) is applied to the logits as they are read back.

That is one token a step (decoding); a prompt runs in steps of up to ``prompt_step`` tokens
(:mod:`~anyformer_diskformer.engines.gpu.gemma4_prompt`), the same dispatches built over the step's tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from anyformer_diskformer.arch.gemma4_config import Gemma4Config
from anyformer_diskformer.arch.moe_config import EXPERT_TENSORS
from anyformer_diskformer.cache.expert_cache import ExpertCache
from anyformer_diskformer.cache.expert_reader import expert_spans
from anyformer_diskformer.cache.prefetch import likely_experts
from anyformer_diskformer.compute.routing import route
from anyformer_diskformer.engines.gpu.gemma4_prompt import Gemma4PromptSteps
from anyformer_diskformer.engines.gpu.moe import GpuMoEEngine, GpuSlots
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.kernels import Dispatch
from anyformer_gguf_gpu.quants import QuantFormat, dequantize
from anyformer_gguf_gpu.transformer import Weight, cos_sin_table


class Gemma4GpuEngine(GpuMoEEngine):
    """A loaded Gemma 4 MoE on one GPU: a KV cache per layer in that layer's head width, experts in GPU slots."""

    config: Gemma4Config

    def _build(self, gguf: GGUFFile, make_cache: Callable[[GpuSlots], ExpertCache[int]]) -> None:
        c, ctx = self.config, self.ctx
        self._load_gemma4(gguf)
        spans = expert_spans(gguf, c.n_layer, c.n_expert)
        slab = tuple(max(span.length for (_, k), span in spans.items() if k == kind) for kind in EXPERT_TENSORS)
        self.slots = GpuSlots(self, (slab[0], slab[1], slab[2]))
        #: The expert cache, its store the GPU slots.
        self.cache = make_cache(self.slots)
        if self.trace is not None:
            self.cache.take_accesses()  # start recording
        # The residual, q/k/v, attention, MLP and score rows hold a prompt step's tokens (decoding uses the first).
        n = self.prompt_step
        buf, e = self.buffer, 4 * n * c.n_embd
        widest = max(c.heads[i] * c.head_dims[i] + 2 * c.kv_heads[i] * c.head_dims[i] for i in range(c.n_layer))
        self.h = buf(e, "residual")
        self.qkv = buf(4 * n * widest, "qkv")
        self.attn = buf(4 * n * max(h * d for h, d in zip(c.heads, c.head_dims, strict=True)), "attention")
        self.attn_out = buf(e, "attention-output")
        self.gate_up = buf(8 * max(c.n_ff_exp, *c.ffs), "gate-up")
        self.mlp = buf(e, "mlp")
        self.routed = buf(e, "experts")
        self.ffn_sum = buf(e, "ffn")
        self.zeros = self._upload(np.zeros(n * c.n_embd, dtype=np.float32), "zeros")
        # This layer's router logits, then the next layer's router on this layer's residual: the prefetcher's guess.
        self.router = buf(8 * c.n_expert, "router")
        self.logits = buf(4 * c.n_vocab, "logits")
        self.scores = buf(4 * n * max(c.heads) * ctx, "scores")
        self.ids = buf(4 * (ctx + 1), "ids")
        self.state = buf(16, "state")
        self.gate_norm = buf(4 * c.n_embd, "gate-norm")
        # A sliding layer's K and V are a ring (position p at row p % rows) of n_swa + prompt_step - 1 rows: a step
        # stores its keys before it attends (see Gemma4Config.kv_rows).
        self.kv_rows = c.kv_rows(ctx, self.prompt_step)
        self.k_cache = [buf(4 * self.kv_rows[i] * c.kv_heads[i] * c.head_dims[i], f"k{i}") for i in range(c.n_layer)]
        self.v_cache = [buf(4 * self.kv_rows[i] * c.kv_heads[i] * c.head_dims[i], f"v{i}") for i in range(c.n_layer)]
        factors = self.host.get("rope_freqs.weight")
        swa_rot = max((c.rots[i] for i in range(c.n_layer) if c.swa[i]), default=2)
        self._tables = {
            True: self._upload(cos_sin_table(ctx, swa_rot, c.rope_base_swa), "rope-swa"),
            False: self._upload(
                cos_sin_table(ctx, c.n_rot, c.rope_base, None if factors is None else factors[: c.n_rot // 2]),
                "rope-full",
            ),
        }
        self._embed = self.embed_dispatch(1)
        self._layers = [
            self._attention_dispatches(i) + self.mlp_dispatches(i, 1, self.gate_up) for i in range(c.n_layer)
        ]
        self._routers = [self._router_dispatches(i) for i in range(c.n_layer)]
        self._finish = [self.finish_dispatches(i, 1) for i in range(c.n_layer)]
        self._head = self.head_dispatch(0)
        if n > 1:
            self.prompt = Gemma4PromptSteps(self, n)

    def _load_gemma4(self, gguf: GGUFFile) -> None:
        """Matrices as stored (q/k/v and gate/up stacked where they can be), vectors as f32 on the GPU and host."""
        c = self.config
        matrices: list[tuple[str, list[str]]] = [("token_embd.weight", ["token_embd.weight"])]
        if not c.tied_output:
            matrices.append(("output.weight", ["output.weight"]))
        for i in range(c.n_layer):
            p = f"blk.{i}."
            # A layer without v takes its keys as values: k's product again, in v's place.
            qkv = [p + "attn_q.weight", p + "attn_k.weight", p + ("attn_v.weight" if c.has_v[i] else "attn_k.weight")]
            if Weight.can_stack(self.gpu, gguf, qkv):
                matrices.append((p + "attn_qkv", qkv))
            else:
                matrices += [(p + f"attn_{n}", [name]) for n, name in zip("qkv", qkv, strict=True)]
            gate_up = [p + "ffn_gate.weight", p + "ffn_up.weight"]
            if Weight.can_stack(self.gpu, gguf, gate_up):
                matrices.append((p + "ffn_gate_up", gate_up))
            else:
                matrices += [(p + "ffn_gate", gate_up[:1]), (p + "ffn_up", gate_up[1:])]
            names = ["attn_output.weight", "ffn_down.weight"] + (["ffn_gate_inp.weight"] if c.moe[i] else [])
            matrices += [(p + n, [p + n]) for n in names]
        for name, parts in matrices:
            weight = Weight(self.gpu, gguf, parts)
            self._owned.append(weight.buffer)
            self.weights[name] = weight
        #: Every vector (norms, scales, rotary factors) as f32 on the host; norms on the GPU too.
        self.host: dict[str, np.ndarray] = {}
        self.norms: dict[str, Any] = {}
        for t in gguf.header.tensors:
            if len(t.dims) == 1:
                values = dequantize(gguf.raw(t.name), t.ggml_type).astype(np.float32)
                self.host[t.name] = values
                if "norm" in t.name:
                    self.norms[t.name] = self._upload(values, t.name)
        self._qk_norms = [
            self._upload(
                np.concatenate([self.host[f"blk.{i}.attn_q_norm.weight"], self.host[f"blk.{i}.attn_k_norm.weight"]]),
                f"qk-norm{i}",
            )
            for i in range(c.n_layer)
        ]
        # The router reads the residual normalised without weight, over sqrt(n_embd), times its scale: one
        # weight vector for the product's fused norm.
        inv = np.float32(1.0 / np.sqrt(c.n_embd))
        self._router_norms = {
            i: self._upload(self.host[f"blk.{i}.ffn_gate_inp.scale"] * inv, f"router-norm{i}")
            for i in range(c.n_layer)
            if c.moe[i]
        }

    # Dispatches, built once.

    def embed_dispatch(self, tokens: int) -> Dispatch:
        """The embeddings of ``tokens`` tokens from position state[0], scaled by sqrt(n_embd), into the residual."""
        embd = self.weights["token_embd.weight"]
        scale = math.sqrt(self.config.n_embd)
        return self.kernels.embed(
            embd.buffer, embd.fmt, embd.rows, embd.cols, self.ids, self.h, self.state, tokens, scale=scale
        )

    def attention_dispatches_for(self, i: int, tokens: int) -> list[Dispatch]:
        """Layer ``i``'s attention over ``tokens`` tokens at positions state[0].. (causal among them; a sliding
        layer's token at p sees p - n_swa + 1 .. p), its normalised output added to the residual."""
        c, p, k = self.config, f"blk.{i}.", self.kernels
        heads, kv_heads, d = c.heads[i], c.kv_heads[i], c.head_dims[i]
        q_dim, kv_dim = heads * d, kv_heads * d
        norm = {"norm": self.norms[p + "attn_norm.weight"], "eps": c.eps, "tokens": tokens}
        out: list[Dispatch] = []
        if p + "attn_qkv" in self.weights:
            out.append(self.mv(self.weights[p + "attn_qkv"], self.h, self.qkv, **norm))
        else:
            for name, off in (("attn_q", 0), ("attn_k", q_dim), ("attn_v", q_dim + kv_dim)):
                w = self.weights[p + name]
                out.append(self.mv(w, self.h, self.qkv, y_off=off, y_stride=q_dim + 2 * kv_dim, **norm))
        out.append(
            k.rope_store(
                self.qkv,
                self.k_cache[i],
                self.v_cache[i],
                self._tables[c.swa[i]],
                self._qk_norms[i],
                self.state,
                n_head=heads,
                n_kv=kv_heads,
                head_dim=d,
                n_rot=c.rots[i],
                neox=True,
                qk_norm=True,
                eps=c.eps,
                v_norm=True,
                tokens=tokens,
                ring=self._ring(i),
            )
        )
        out.append(
            k.attention(
                self.qkv,
                self.k_cache[i],
                self.v_cache[i],
                self.attn,
                self.scores,
                self.state,
                n_head=heads,
                n_kv=kv_heads,
                head_dim=d,
                ctx=self.ctx,
                scale=1.0,  # Gemma 4 scales its scores by 1
                window=c.n_swa if c.swa[i] else 0,
                tokens=tokens,
                ring=self._ring(i),
            )
        )
        out.append(self.mv(self.weights[p + "attn_output.weight"], self.attn, self.attn_out, tokens=tokens))
        norm_w = self.norms[p + "post_attention_norm.weight"]
        out.append(k.rmsnorm(self.attn_out, norm_w, self.h, c.n_embd, c.eps, accumulate=True, tokens=tokens))
        return out

    def _ring(self, i: int) -> int:
        """The kernels' ring for layer ``i``'s cache: its rows for a sliding layer, 0 (a row per position) else."""
        return self.kv_rows[i] if self.config.swa[i] else 0

    def mlp_dispatches(self, i: int, tokens: int, gate_up: Any) -> list[Dispatch]:
        """Layer ``i``'s dense GELU MLP of ``tokens`` residual rows (``ffn_norm`` fused into gate and up, their
        [gate | up] rows in ``gate_up``) into ``mlp``."""
        c, p = self.config, f"blk.{i}."
        n_ff = c.ffs[i]
        kw = {"norm": self.norms[p + "ffn_norm.weight"], "eps": c.eps, "tokens": tokens}
        if p + "ffn_gate_up" in self.weights:
            out = [self.mv(self.weights[p + "ffn_gate_up"], self.h, gate_up, **kw)]
        else:
            out = [
                self.mv(self.weights[p + "ffn_gate"], self.h, gate_up, y_stride=2 * n_ff, **kw),
                self.mv(self.weights[p + "ffn_up"], self.h, gate_up, y_off=n_ff, y_stride=2 * n_ff, **kw),
            ]
        down = self.weights[p + "ffn_down.weight"]
        out.append(self.mv(down, gate_up, self.mlp, tokens=tokens, swiglu=True, gelu=True))
        return out

    def _router_dispatches(self, i: int) -> list[Dispatch]:
        """Layer ``i``'s router logits (a MoE layer), and the next MoE layer's on the same residual where a
        prefetcher guesses: a dense layer before a MoE layer guesses too, as the CPU engine does."""
        c = self.config
        out: list[Dispatch] = []
        if c.moe[i]:
            w = self.weights[f"blk.{i}.ffn_gate_inp.weight"]
            out.append(self.mv(w, self.h, self.router, **self.router_norm(i)))
        if self.cache.prefetcher is not None and i + 1 < c.n_layer and c.moe[i + 1]:
            w = self.weights[f"blk.{i + 1}.ffn_gate_inp.weight"]
            out.append(self.mv(w, self.h, self.router, y_off=c.n_expert, **self.router_norm(i + 1)))
        return out

    def router_norm(self, i: int) -> dict[str, Any]:
        """The fused norm of layer ``i``'s router product: no weight but ``ffn_gate_inp.scale`` / sqrt(n_embd)."""
        return {"norm": self._router_norms[i], "eps": self.config.eps}

    def finish_dispatches(self, i: int, tokens: int) -> list[Dispatch]:
        """The layer's FFN output of ``tokens`` rows normalised into the residual, scaled by the layer's output
        scale (a MoE layer's MLP and experts each normalised first, from ``mlp`` and ``routed``)."""
        c, p, k = self.config, f"blk.{i}.", self.kernels
        scale = float(self.host[p + "layer_output_scale.weight"][0]) if c.out_scale[i] else 1.0
        post = self.norms[p + "post_ffw_norm.weight"]
        n = tokens
        if not c.moe[i]:
            return [k.rmsnorm(self.mlp, post, self.h, c.n_embd, c.eps, accumulate=True, scale=scale, tokens=n)]
        post_1, post_2 = self.norms[p + "post_ffw_norm_1.weight"], self.norms[p + "post_ffw_norm_2.weight"]
        return [
            k.rmsnorm(self.mlp, post_1, self.ffn_sum, c.n_embd, c.eps, tokens=n),
            k.rmsnorm(self.routed, post_2, self.ffn_sum, c.n_embd, c.eps, accumulate=True, tokens=n),
            k.rmsnorm(self.ffn_sum, post, self.h, c.n_embd, c.eps, accumulate=True, scale=scale, tokens=n),
        ]

    def ffn_dispatches(
        self, gate_up: list[tuple[Any, QuantFormat]], down: tuple[Any, QuantFormat], up_norm: Any, n_ff: int
    ) -> list[Dispatch]:
        """One GELU expert of the residual: gate (``pre_ffw_norm_2``), up (``up_norm``), down added to the experts'
        sum."""
        c, k = self.config, self.kernels
        (gate, gate_fmt), (up, up_fmt) = gate_up
        return [
            k.matvec(gate, gate_fmt, n_ff, c.n_embd, self.h, self.gate_up, norm=self.gate_norm, eps=c.eps),
            k.matvec(up, up_fmt, n_ff, c.n_embd, self.h, self.gate_up, y_off=n_ff, norm=up_norm, eps=c.eps),
            k.matvec(
                down[0], down[1], c.n_embd, n_ff, self.gate_up, self.routed, accumulate=True, swiglu=True, gelu=True
            ),
        ]

    # Steps.

    def _step(self, pos: int, *, head: bool) -> np.ndarray | None:
        c, gpu = self.config, self.gpu
        gpu.write(self.state, np.array([pos, 1, 0, 0], dtype=np.uint32))
        pending = [self._embed]
        for layer in range(c.n_layer):
            pending += self._layers[layer]
            guessing = len(self._routers[layer]) > int(c.moe[layer])
            if not c.moe[layer] and not guessing:
                pending += self._finish[layer]  # nothing to route or guess: nothing read back
                continue
            # The experts' sum starts from zero: the copy runs after this submission's dispatches.
            zero = [(self.zeros, 0, self.routed, 0, 4 * c.n_embd)] if c.moe[layer] else []
            self.kernels.run(pending + self._routers[layer], zero)
            prefetcher = self.cache.prefetcher
            logits = gpu.read(self.router, np.float32, 2 * c.n_expert if guessing else c.n_expert)
            if prefetcher is not None and guessing:
                likely = likely_experts(logits[None, c.n_expert :], c.n_expert_used, prefetcher.width)
                self.cache.expect(layer + 1, likely)
                prefetcher.request(layer + 1, likely, self.cache)
            if not c.moe[layer]:
                if prefetcher is not None:
                    # No lookups here to start the reads after: start them now, overlapping this layer's MLP.
                    prefetcher.start(layer)
                pending = list(self._finish[layer])
                continue
            chosen, weights = route(logits[None, : c.n_expert], c.n_expert_used, True)
            experts = [int(e) for e in chosen[0]]
            slots = self.cache.fetch(layer, experts)
            p = f"blk.{layer}."
            norm = self.host[p + "pre_ffw_norm_2.weight"]
            scales = self.host.get(p + "ffn_down_exps.scale")
            gpu.write(self.gate_norm, norm)
            pending = []
            for slot, expert, weight in zip(slots, experts, weights[0], strict=True):
                # The router weight and the expert's output scale, folded into up's norm weights (both linear).
                factor = weight * (scales[expert] if scales is not None else np.float32(1.0))
                pending += self.slots.dispatches(slot, norm * np.float32(factor))
            pending += self._finish[layer]
        if not head:
            self.kernels.run(pending)
            return None
        self.kernels.run([*pending, self._head])
        return self.read_logits()

    def read_logits(self) -> np.ndarray:
        """The logits the head last wrote, soft-capped (tanh) where the model says so."""
        c = self.config
        logits = self.gpu.read(self.logits, np.float32, c.n_vocab)
        if c.softcap:
            cap = np.float32(c.softcap)
            logits = (np.tanh(logits / cap) * cap).astype(np.float32)
        return logits

    def _kv_bytes(self, n: int) -> list[int]:
        """Bytes of each layer's keys (or values) after a step ending at position ``n``: n rows, at most a ring's."""
        c = self.config
        return [4 * min(n, self.kv_rows[i]) * c.kv_heads[i] * c.head_dims[i] for i in range(c.n_layer)]

    def checkpoint(self, n: int) -> list[Any]:
        """GPU copies of every layer's keys and values after a step ending at position ``n``: positions 0..n-1 of a
        full layer, a sliding layer's ring (see :meth:`resumes_at`)."""
        sizes = self._kv_bytes(n) * 2
        saved = [self.buffer(max(4, size), "kv-checkpoint") for size in sizes]
        caches = self.k_cache + self.v_cache
        copies = [(cache, 0, copy, 0, size) for cache, copy, size in zip(caches, saved, sizes, strict=True) if size]
        self.kernels.run([], copies)
        return saved

    def restore(self, saved: list[Any], n: int) -> None:
        """Put back the first ``n`` positions of a :meth:`checkpoint` (a ring whole: the rows of positions from ``n``
        on are rewritten before any step reads them), queued before the next step, where :meth:`resumes_at`
        allows."""
        full, rings = self._kv_bytes(n) * 2, self._kv_bytes(self.ctx) * 2
        caches = self.k_cache + self.v_cache
        sliding = self.config.swa * 2
        # A ring's checkpoint holds min(length, rows) rows (and the buffer's padding): all of it goes back.
        sizes = [
            min(int(copy.size), ring) if swa else size
            for copy, swa, ring, size in zip(saved, sliding, rings, full, strict=True)
        ]
        copies = [(copy, 0, cache, 0, size) for cache, copy, size in zip(caches, saved, sizes, strict=True) if size]
        self.kernels.run([], copies)

    def resumes_at(self, length: int, n: int) -> bool:
        """Whether a checkpoint of ``length`` positions can resume at position ``n``: every ring still holds the
        window before ``n``."""
        return self.config.ring_resumes(self.ctx, self.prompt_step, length, n)
