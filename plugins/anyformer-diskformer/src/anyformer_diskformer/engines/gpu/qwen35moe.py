"""qwen35moe (Qwen3.5/3.6 MoE) on wgpu: the graph of :mod:`~anyformer_diskformer.engines.cpu.qwen35moe` with the GPU
engine's dense weights, KV cache, expert slots and prefetch.

A gated delta-net layer runs in four kinds of dispatch: its projections of the normalised residual (the
mixed q/k/v channels, the output gate z, beta and alpha, stacked where they share a type), the
causal depthwise convolution with SiLU (gguf-gpu's short-convolution kernel without LFM2's gates,
its rolling state on the GPU), the gated delta rule with the per-head norm times silu(z) (one
workgroup per value head, its state matrix on the GPU), and ssm_out added to the residual. A
full-attention layer's q projection gives each head's query followed by its output gate: rope_store
and attention read the queries 2 head_dim apart, and attention scales its output by sigmoid(gate).
The interleaved multi-section rotary is the rotary table with the pairs that do not turn for text
held at cos 1, sin 0. The FFN follows ``post_attention_norm`` as the MoE engine's (routed experts
and the sigmoid-gated shared expert). Both kernels start from zero states at position 0; a
checkpoint holds the states after its positions, so it resumes only at its own length.

A prompt runs in the MoE engine's steps (:mod:`~anyformer_diskformer.engines.gpu.prompt`: a step's experts fetched once
each), its layers built here over the step's tokens (:meth:`HybridGpuEngine.attention_dispatches_for`): the
projections, the convolution (its kernel walks a step's tokens in order), ssm_out and the attention layers run over
the whole step; the delta rule is recurrent and its kernel takes one token, so it is one dispatch per token, in
order, each bound to its token's rows of the step's buffers (rows 256 bytes apart, the largest storage-offset
alignment WebGPU lets a device ask for) and to a position block that says "not fresh" after the step's first token.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_diskformer.engines.cpu.qwen35moe import imrope_turns
from anyformer_diskformer.engines.gpu.layout import aligned_row
from anyformer_diskformer.engines.gpu.moe import GpuMoEEngine
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.kernels import Dispatch
from anyformer_gguf_gpu.lfm2_config import MAX_CONV_TAPS
from anyformer_gguf_gpu.quants import dequantize
from anyformer_gguf_gpu.shortconv import ShortConvKernel
from anyformer_gguf_gpu.transformer import Weight

#: A delta-net layer's projections, in the order their rows sit in the projection buffer.
_DELTA_PROJECTIONS = ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha")


class HybridGpuEngine(GpuMoEEngine):
    """A loaded qwen35moe model on one GPU: KV caches for its attention layers, states for its delta nets."""

    #: A delta net's state sums every token before it: a checkpoint resumes only at its own length.
    resumes_only_whole = True

    def _build(self, gguf: GGUFFile, make_cache: Any) -> None:
        c = self.config
        if not 2 <= c.ssm_conv <= MAX_CONV_TAPS:
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"a {c.ssm_conv}-tap convolution (the GPU kernel holds 2..{MAX_CONV_TAPS})"
            )
        keys, values = c.ssm_k_heads * c.ssm_head, c.ssm_v_heads * c.ssm_head
        #: The delta nets' widths: convolution channels ([q | k | v]), output values, projection row.
        self._channels, self._values = 2 * keys + values, values
        self._proj_floats = self._channels + values + 2 * c.ssm_v_heads
        self._conv_kernel = ShortConvKernel(self.kernels, gated=False)
        self._conv_kernel.compile()
        buf, n = self.buffer, self.prompt_step
        # A prompt step's rows of each, ROW_ALIGN-aligned apart (decoding uses the first).
        self._strides = tuple(aligned_row(f) for f in (self._proj_floats, self._channels, values))
        self.proj = buf(4 * n * self._strides[0], "delta-projections")
        self.conv_out = buf(4 * n * self._strides[1], "delta-conv")
        self.delta_out = buf(4 * n * self._strides[2], "delta-out")
        #: The position block the delta rule reads after a step's first token: a position above 0 (not a new
        #: sequence, so the state is kept).
        self._later = self._upload(np.array([1, 1, 0, 0], dtype=np.uint32), "later-token") if n > 1 else None
        recurrent = [i for i in range(c.n_layer) if c.is_recurrent(i)]
        self.conv_state = {i: buf(4 * (c.ssm_conv - 1) * self._channels, f"conv-state{i}") for i in recurrent}
        self.delta_state = {i: buf(4 * c.ssm_v_heads * c.ssm_head**2, f"delta-state{i}") for i in recurrent}
        super()._build(gguf, make_cache)

    def _qkv_floats(self) -> int:
        c = self.config
        return 2 * c.q_dim + 2 * c.kv_dim  # each query head is followed by its output gate

    def _rope_table(self) -> np.ndarray:
        table = super()._rope_table()
        c = self.config
        if c.rope_sections:
            turns = imrope_turns(c.n_rot // 2, c.rope_sections)
            table[:, ~turns, 0] = 1.0  # cos 0
            table[:, ~turns, 1] = 0.0  # sin 0
        return table

    def _attention_matrices(self, gguf: GGUFFile, i: int) -> list[tuple[str, list[str]]]:
        p = f"blk.{i}."
        if not self.config.is_recurrent(i):
            return super()._attention_matrices(gguf, i)
        parts = [p + n + ".weight" for n in _DELTA_PROJECTIONS]
        out = [(p + "ssm_out.weight", [p + "ssm_out.weight"])]
        if Weight.can_stack(self.gpu, gguf, parts):
            return [(p + "delta_proj", parts), *out]
        return [*((n, [n]) for n in parts), *out]

    def _load_weights(self, gguf: GGUFFile) -> None:
        super()._load_weights(gguf)
        c = self.config
        self._taps: dict[int, Any] = {}
        self._delta_vecs: dict[int, Any] = {}
        for i in range(c.n_layer):
            if not c.is_recurrent(i):
                continue
            p = f"blk.{i}."

            def vector(name: str) -> np.ndarray:
                t = gguf.tensor(name)
                return dequantize(gguf.raw(name), t.ggml_type).astype(np.float32)

            # ggml's (taps, channels) is channels rows of taps, the last tap on the current token.
            self._taps[i] = self._upload(vector(p + "ssm_conv1d.weight"), f"conv-taps{i}")
            vecs = np.concatenate([vector(p + "ssm_dt.bias"), vector(p + "ssm_a"), vector(p + "ssm_norm.weight")])
            self._delta_vecs[i] = self._upload(vecs, f"delta-vectors{i}")

    def attention_dispatches_for(self, i: int, tokens: int) -> list[Dispatch]:
        """Layer ``i``'s delta net or gated attention over ``tokens`` tokens at positions state[0].., added to h."""
        if self.config.is_recurrent(i):
            return self._delta_net_dispatches(i, tokens)
        c, p, k = self.config, f"blk.{i}.", self.kernels
        q_span = 2 * c.q_dim
        stride = q_span + 2 * c.kv_dim
        norm = {"norm": self.norms[p + "attn_norm.weight"], "eps": c.eps, "tokens": tokens}
        out: list[Dispatch] = []
        if p + "attn_qkv.weight" in self.weights:
            out.append(self.mv(self.weights[p + "attn_qkv.weight"], self.h, self.qkv, **norm))
        else:
            for name, off in (("attn_q", 0), ("attn_k", q_span), ("attn_v", q_span + c.kv_dim)):
                w = self.weights[p + name + ".weight"]
                out.append(self.mv(w, self.h, self.qkv, y_off=off, y_stride=stride, **norm))
        out.append(
            k.rope_store(
                self.qkv,
                self.k_cache[i],
                self.v_cache[i],
                self.cos_sin,
                self._qk_norm[i],
                self.state,
                n_rot=c.n_rot,
                neox=c.rope_neox,
                qk_norm=True,
                eps=c.eps,
                q_stride=2 * c.head_dim,
                n_head=c.n_head,
                n_kv=c.n_kv,
                head_dim=c.head_dim,
                tokens=tokens,
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
                ctx=self.ctx,
                scale=1.0 / float(np.sqrt(c.head_dim)),
                gated=True,
                n_head=c.n_head,
                n_kv=c.n_kv,
                head_dim=c.head_dim,
                tokens=tokens,
            )
        )
        out.append(self.mv(self.weights[p + "attn_output.weight"], self.attn, self.h, accumulate=True, tokens=tokens))
        return out

    def _delta_net_dispatches(self, i: int, tokens: int) -> list[Dispatch]:
        """Layer ``i``'s gated delta net over ``tokens`` tokens added to the residual: the projections, convolution
        and ssm_out over them all, the delta rule a dispatch per token, in order (its state carries between them)."""
        c, p = self.config, f"blk.{i}."
        proj_row, conv_row, out_row = self._strides
        norm = {"norm": self.norms[p + "attn_norm.weight"], "eps": c.eps, "tokens": tokens}
        out: list[Dispatch] = []
        if p + "delta_proj" in self.weights:
            out.append(self.mv(self.weights[p + "delta_proj"], self.h, self.proj, y_stride=proj_row, **norm))
        else:
            off = 0
            for name in _DELTA_PROJECTIONS:
                w = self.weights[p + name + ".weight"]
                out.append(self.mv(w, self.h, self.proj, y_off=off, y_stride=proj_row, **norm))
                off += w.rows
        out.append(
            self._conv_kernel.dispatch(
                self.proj,
                self._taps[i],
                self.conv_state[i],
                self.conv_out,
                self.state,
                n=self._channels,
                n_taps=c.ssm_conv,
                tokens=tokens,
                x_stride=proj_row,
                y_stride=conv_row,
            )
        )
        z_off = self._channels
        for t in range(tokens):
            # Token t's rows; only the step's first token may be a new sequence's (position 0: zero state).
            out.append(
                self.kernels.delta_rule(
                    (self.conv_out, 4 * t * conv_row, 4 * self._channels),
                    (self.proj, 4 * t * proj_row, 4 * self._proj_floats),
                    self._delta_vecs[i],
                    self.delta_state[i],
                    (self.delta_out, 4 * t * out_row, 4 * self._values),
                    self.state if t == 0 else self._later,
                    k_heads=c.ssm_k_heads,
                    v_heads=c.ssm_v_heads,
                    head_dim=c.ssm_head,
                    z_off=z_off,
                    beta_off=z_off + self._values,
                    alpha_off=z_off + self._values + c.ssm_v_heads,
                    eps=c.eps,
                )
            )
        w = self.weights[p + "ssm_out.weight"]
        out.append(self.mv(w, self.delta_out, self.h, accumulate=True, tokens=tokens, x_stride=out_row))
        return out

    def _states(self) -> list[Any]:
        return [*self.conv_state.values(), *self.delta_state.values()]

    def checkpoint(self, n: int) -> list[Any]:
        """The KV of positions 0..n-1 and every delta net's state after them, on the GPU (see :meth:`restore`)."""
        saved = super().checkpoint(n)
        states = [self.buffer(int(s.size), "state-checkpoint") for s in self._states()]
        copies = [(s, 0, copy, 0, int(s.size)) for s, copy in zip(self._states(), states, strict=True)]
        self.kernels.run([], copies)
        return [*saved, *states, n]

    def restore(self, saved: list[Any], n: int) -> None:
        """Put back a :meth:`checkpoint` of exactly ``n`` positions; the next step starts at position n."""
        length = saved[-1]
        if n != length:
            raise ValueError(f"a delta-net checkpoint of {length} positions cannot resume at {n}")
        count = len(self._states())
        kv, states = saved[: -1 - count], saved[-1 - count : -1]
        super().restore(kv, n)
        copies = [(copy, 0, s, 0, int(s.size)) for s, copy in zip(self._states(), states, strict=True)]
        self.kernels.run([], copies)

    def forget(self, saved: list[Any]) -> None:
        """Free a checkpoint's buffers."""
        super().forget(saved[:-1])
