"""The lfm2 engine (LFM2, LFM2.5): gated short convolutions and grouped-query attention, one submission per step.

Built as the llama-family engine is (:mod:`anyformer_gguf_gpu.transformer`, whose host side it
inherits: ids on the GPU, steps, prefill, read-back, sampling): every weight uploaded as its raw
GGUF blocks, every pipeline compiled and every bind group and buffer a step uses made at load. A step's dispatches:
embedding lookup, then per layer

- a convolution layer: in_proj of the normed residual into [B | C | x] (RMSNorm fused into the
  matrix kernel), the gated convolution (:mod:`anyformer_gguf_gpu.shortconv`; its rolling state of
  the last ``l_cache - 1`` inputs stays on the GPU per layer), out_proj added to the residual;
- an attention layer: q/k/v of the normed residual, per-head q/k RMSNorm and NEOX RoPE with the
  K/V store (inside the attention dispatch where heads are a multiple of 4 wide), attention over the cache (split
  along the sequence past ``split_from`` keys, then combined), the output projection added to the
  residual;

then the SwiGLU feed-forward (gate and up of the normed residual, down reading silu(gate) * up);
after the last layer the final norm (``token_embd_norm``), the head and sampling.

The convolution state makes a step depend on the steps before it: a sequence starts at position
0 (the kernel then starts from zeros) and its steps run in order, as prefill and decoding do.
"""

from __future__ import annotations

import math
from typing import Any

from anyformer.plugin import GGUFHeader
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.gpu import GPU
from anyformer_gguf_gpu.kernels import (
    PLAIN_KERNELS,
    AttentionRope,
    Dispatch,
    Kernels,
    PipelineKey,
    attention_kernel,
    attention_scratch_bytes,
)
from anyformer_gguf_gpu.lfm2_config import MAX_CONV_TAPS, Lfm2Config, lfm2_footprint, read_lfm2_config
from anyformer_gguf_gpu.shortconv import ShortConvKernel
from anyformer_gguf_gpu.transformer import (
    DEFAULT_MAX_BATCH,
    SPLIT_FROM,
    LoadProgress,
    TransformerEngine,
    Weight,
    _vector,
    cos_sin_table,
)


class Lfm2Engine(TransformerEngine):
    """An LFM2 model on one GPU: a KV cache of ``ctx`` positions per attention layer, steps of up to ``max_batch``."""

    def __init__(
        self,
        gpu: GPU,
        gguf: GGUFFile,
        *,
        ctx: int,
        max_batch: int = DEFAULT_MAX_BATCH,
        kv_f16: bool | None = None,
        progress: LoadProgress | None = None,
    ) -> None:
        self.gpu = gpu
        self.lfm2: Lfm2Config = read_lfm2_config(gguf.header)
        c = self.lfm2
        self.config = c  # type: ignore[assignment]  # the inherited host side reads only n_vocab
        self.ctx = max(1, min(ctx, c.n_ctx_train))
        self.max_batch = max(1, max_batch)
        self.kernels = Kernels(gpu, kv_f16=gpu.has_f16 if kv_f16 is None else kv_f16)
        self.conv = ShortConvKernel(self.kernels)
        report = progress or (lambda what, done, total: None)

        # Weights: raw blocks; q/k/v and gate/up stacked into one matrix where they can be.
        groups: dict[str, list[str]] = {}
        for i in range(c.n_layer):
            p = f"blk.{i}."
            stacks = [("attn_qkv", ("attn_q", "attn_k", "attn_v"))] if c.is_attention(i) else []
            for stack, members in [*stacks, ("ffn_gate_up", ("ffn_gate", "ffn_up"))]:
                parts = [f"{p}{m}.weight" for m in members]
                if Weight.can_stack(gpu, gguf, parts):
                    groups[f"{p}{stack}.weight"] = parts
        stacked = {name for parts in groups.values() for name in parts}
        names = [t.name for t in gguf.header.tensors]
        for name in names:
            # The convolution taps are 2-D too, but a few floats per channel: read as f32 below.
            if len(gguf.tensor(name).dims) == 2 and name not in stacked and not name.endswith("shortconv.conv.weight"):
                groups[name] = [name]
        self.weights: dict[str, Weight] = {}
        for done, (name, parts) in enumerate(groups.items(), 1):
            self.weights[name] = Weight(gpu, gguf, parts)
            report("upload", done, len(groups))
        self.norms = {n: _vector(gpu, gguf, n) for n in names if n.endswith("norm.weight")}
        self.taps = {i: _vector(gpu, gguf, f"blk.{i}.shortconv.conv.weight") for i in c.conv_layers}
        self.head = self.weights["token_embd.weight" if c.tied_output else "output.weight"]

        # Activations for max_batch tokens; the conv output reuses the attention output's buffer
        # (both are n_embd wide, and a layer is one or the other).
        b = self.max_batch
        buf = gpu.buffer
        self.h = buf(b * c.n_embd * 4, label="residual")
        self.qkv = buf(b * (c.q_dim + 2 * c.kv_dim) * 4, label="qkv")
        self.attn = buf(b * c.q_dim * 4, label="attention")
        self.bcx = buf(b * 3 * c.n_embd * 4, label="conv-bcx")
        self.gate_up = buf(b * 2 * c.n_ff * 4, label="gate-up")
        self.logits = buf(b * c.n_vocab * 4, label="logits")
        self.scores = buf(attention_scratch_bytes(b, c.n_head, self.ctx, c.head_dim), label="scores")
        self._step_buffers()
        self.split_from = SPLIT_FROM
        kv_value = 2 if self.kernels.kv_f16 else 4
        self.k_cache = [buf(self.ctx * c.kv_dim * kv_value, label=f"k{i}") for i in c.attention_layers]
        self.v_cache = [buf(self.ctx * c.kv_dim * kv_value, label=f"v{i}") for i in c.attention_layers]
        self.conv_state = {i: buf((MAX_CONV_TAPS - 1) * c.n_embd * 4, label=f"conv{i}") for i in c.conv_layers}
        self.cos_sin = gpu.upload(cos_sin_table(self.ctx, c.n_rot, c.rope_base), label="rope")
        self._qk_norm = [self._qk_norm_buffer(gguf, i) for i in c.attention_layers]
        self.gpu_bytes = self._held_bytes(gguf.header)
        # The convolution's pipeline is the engine's own: compiled first, in the same progress count.
        compiled = self.kernels.compile
        compiled(self._pipelines_needed(), lambda done, total: report("compile", done, total), also=[self.conv.compile])
        self._bind_programs(report)

    def _held_bytes(self, header: GGUFHeader) -> int:
        """What this engine holds on the GPU, by the same arithmetic ``can_run`` estimates with."""
        return lfm2_footprint(header.summary(), self.ctx, self.max_batch, kv_f16=self.kernels.kv_f16).gpu_bytes

    def _pipelines_needed(self) -> list[PipelineKey]:
        """Every (kernel, quant, tokens_per_thread, swiglu, norm[, rope, split]) pipeline the steps encode."""
        wanted: list[PipelineKey] = [
            (k, None, 1, False, False) for k in PLAIN_KERNELS if k not in ("swiglu", "rmsnorm", "argmax", "sample")
        ]
        for tokens in {1, self.max_batch}:
            for name, weight in self.weights.items():
                down = name.endswith("ffn_down.weight")
                # Projections of the residual normalise it; the three that read an activation do not.
                normed = not name.endswith(("ffn_down.weight", "attn_output.weight", "shortconv.out_proj.weight"))
                wanted.append(self.kernels.matrix_key(weight.fmt.name, weight.rows, tokens, swiglu=down, norm=normed))
        embedding = self.weights["token_embd.weight"].fmt.name
        wanted += [(kernel, embedding, 1, False, False) for kernel in ("embed", "argmax", "sample")]
        if attention_kernel(self.lfm2.head_dim) == "attention_vec4":
            wanted.append(("attention_vec4", None, 1, False, False, True))  # rotary inside attention
        return wanted + self.split_variants()

    def release(self) -> None:
        """Free the engine's GPU memory now (not when Python collects it); the engine is unusable after."""
        owned = [w.buffer for w in self.weights.values()] + list(self.norms.values()) + list(self.taps.values())
        owned += self.k_cache + self.v_cache + list(self.conv_state.values())
        owned += [self.h, self.qkv, self.attn, self.bcx, self.gate_up, self.logits, self.scores]
        owned += [self.ids, self.state, self.sampling, self.positions, self.cos_sin, *self._qk_norm]
        self._release_programs()
        self.weights.clear()
        self.norms.clear()
        self.taps.clear()
        self.conv_state.clear()
        self.k_cache, self.v_cache = [], []
        for buf in owned:
            buf.destroy()

    def _build(self, n: int, head: bool, sample: bool, all_logits: bool, split: bool = False) -> list[Dispatch]:
        c, k, w = self.lfm2, self.kernels, self.weights
        embd = w["token_embd.weight"]
        out: list[Dispatch] = [k.embed(embd.buffer, embd.fmt, embd.rows, embd.cols, self.ids, self.h, self.state, n)]

        def mv(name: str, x: Any, y: Any, **kw: Any) -> Dispatch:
            m = w[name]
            return k.matvec(m.buffer, m.fmt, m.rows, m.cols, x, y, tokens=n, **kw)

        for i in range(c.n_layer):
            p = f"blk.{i}."
            op_norm = {"norm": self.norms[p + "attn_norm.weight"], "eps": c.eps}
            if c.is_attention(i):
                out.extend(self._attention(i, n, mv, op_norm, split))
            else:
                out.append(mv(p + "shortconv.in_proj.weight", self.h, self.bcx, **op_norm))  # rows B, C, x
                out.append(
                    self.conv.dispatch(
                        self.bcx,
                        self.taps[i],
                        self.conv_state[i],
                        self.attn,
                        self.state,
                        n=c.n_embd,
                        n_taps=c.l_cache,
                        tokens=n,
                    )
                )
                out.append(mv(p + "shortconv.out_proj.weight", self.attn, self.h, accumulate=True))
            ffn_norm = {"norm": self.norms[p + "ffn_norm.weight"], "eps": c.eps}
            if p + "ffn_gate_up.weight" in w:
                out.append(mv(p + "ffn_gate_up.weight", self.h, self.gate_up, **ffn_norm))  # rows gate, up
            else:
                for name, off in (("ffn_gate", 0), ("ffn_up", c.n_ff)):
                    out.append(
                        mv(p + name + ".weight", self.h, self.gate_up, y_off=off, y_stride=2 * c.n_ff, **ffn_norm)
                    )
            out.append(mv(p + "ffn_down.weight", self.gate_up, self.h, accumulate=True, swiglu=True))
        if head:
            first = 0 if all_logits else n - 1
            hw = self.head
            out.append(
                k.matvec(
                    hw.buffer,
                    hw.fmt,
                    hw.rows,
                    hw.cols,
                    self.h,
                    self.logits,
                    tokens=n - first,
                    x_off=first * c.n_embd,
                    norm=self.norms["token_embd_norm.weight"],
                    eps=c.eps,
                )
            )
        if sample:
            # The last token's logits are the last row of what the head wrote.
            out.append(self._sampler(n, all_logits))
        return out

    def _attention(self, layer: int, n: int, mv: Any, op_norm: dict[str, Any], split: bool) -> list[Dispatch]:
        """One attention layer's dispatches: q/k/v, q/k norm + RoPE + K/V store, attention (+ the combine where
        split), output projection."""
        c, k, w = self.lfm2, self.kernels, self.weights
        p = f"blk.{layer}."
        slot = c.attention_layers.index(layer)
        out: list[Dispatch] = []
        if p + "attn_qkv.weight" in w:
            out.append(mv(p + "attn_qkv.weight", self.h, self.qkv, **op_norm))
        else:
            stride = c.q_dim + 2 * c.kv_dim
            for name, off in (("attn_q", 0), ("attn_k", c.q_dim), ("attn_v", c.q_dim + c.kv_dim)):
                out.append(mv(p + name + ".weight", self.h, self.qkv, y_off=off, y_stride=stride, **op_norm))
        # Attention norms, rotates and stores q/k itself (heads a multiple of 4 wide), as qwen3's does.
        rope_in_attention = attention_kernel(c.head_dim) == "attention_vec4"
        if not rope_in_attention:
            out.append(
                k.rope_store(
                    self.qkv,
                    self.k_cache[slot],
                    self.v_cache[slot],
                    self.cos_sin,
                    self._qk_norm[slot],
                    self.state,
                    n_head=c.n_head,
                    n_kv=c.n_kv,
                    head_dim=c.head_dim,
                    n_rot=c.n_rot,
                    neox=c.rope_neox,
                    tokens=n,
                    qk_norm=True,
                    eps=c.eps,
                )
            )
        args = (self.qkv, self.k_cache[slot], self.v_cache[slot], self.attn, self.scores, self.state)
        dims = {"n_head": c.n_head, "n_kv": c.n_kv, "head_dim": c.head_dim, "ctx": self.ctx}
        scale = 1.0 / math.sqrt(c.head_dim)
        rope = AttentionRope(self.cos_sin, self._qk_norm[slot], c.n_rot, c.rope_neox, True, c.eps)
        out.append(
            k.attention_with_rope(
                rope if rope_in_attention else None, *args, scale=scale, tokens=n, split=split, **dims
            )
        )
        if split:
            out.append(
                k.attention_combine(
                    self.scores, self.attn, self.state, n_head=c.n_head, head_dim=c.head_dim, ctx=self.ctx, tokens=n
                )
            )
        out.append(mv(p + "attn_output.weight", self.attn, self.h, accumulate=True))
        return out
