"""The llama-family engine (llama, qwen3): the whole model resident on the GPU, one submission per step.

At load every weight is uploaded as its raw GGUF blocks (no dequantised copy), every pipeline is
compiled and every bind group and buffer a step can use is made: a step of one token and one of
several (``max_batch`` at load; another count rewrites its uniform blocks, see
:mod:`anyformer_gguf_gpu.programs`), greedy and sampled, split along the sequence where the context
reaches that. Generating creates nothing on the GPU. A step over ``n`` tokens at positions ``pos..pos+n-1`` is
one list of dispatches encoded into one compute pass and one queue submission: embedding lookup
(the ids live on the GPU), then per layer RMSNorm, the q/k/v projections, RoPE with the K/V cache
store, attention, the output projection added to the residual, RMSNorm, gate and up, SwiGLU, and
the down projection added to the residual; then the final norm, the output head and greedy
sampling, whose id is written where the next step's embedding lookup reads it. The sampler also
writes that id's embedding row as the next step's input, so a decode step that follows a sampling
step leaves its embedding lookup out (``chained``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode, GGUFHeader
from anyformer_gguf_gpu.config import ModelConfig, footprint, read_config
from anyformer_gguf_gpu.decode_pacing import LAG, STEPS
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.gpu import GPU
from anyformer_gguf_gpu.kernels import (
    PLAIN_KERNELS,
    AttentionRope,
    Copy,
    Dispatch,
    EmbedNext,
    Kernels,
    PipelineKey,
    RopeStore,
    attention_kernel,
    attention_scratch_bytes,
    sampling_block,
)
from anyformer_gguf_gpu.programs import BoundProgram
from anyformer_gguf_gpu.quants import QuantFormat, dequantize, format_of

#: Most tokens one prefill step processes (the activation buffers are sized for this many).
DEFAULT_MAX_BATCH = 64

#: Keys a token attends to above which attention splits along the sequence (flash-decoding: chunks of
#: ATTENTION_CHUNK keys per workgroup, then a combine dispatch). Below it one workgroup per head is
#: quicker than two dispatches; above it that workgroup's walk over the keys is the step's longest.
#: Measured on an H200 in SmolLM2's shapes (2026-12-01): equal at 256 keys (599 vs 603 tok/s), split
#: ahead from 512 (575 vs 511) and 3.1x at 4096 (508 vs 163); at 8 keys it would cost 6 % (677 vs 720).
SPLIT_FROM = 384

#: Load progress callback: (what, done, total).
LoadProgress = Callable[[str, int, int], None]


def cos_sin_table(ctx: int, n_rot: int, base: float, factors: np.ndarray | None = None) -> np.ndarray:
    """[pos][i] = (cos, sin) of pos * base^(-2i/n_rot) / factor_i, computed in float64, stored as f32."""
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    if factors is not None:
        inv = inv / factors.astype(np.float64)
    angles = np.arange(ctx, dtype=np.float64)[:, None] * inv[None, :]
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1).astype(np.float32)


class Weight:
    """Tensors on the GPU as their raw blocks, rows stacked in one buffer: a format and a shape (rows, cols).

    Several tensors of one type and width (q, k and v; gate and up) stacked are one matrix whose
    product is their outputs side by side: one dispatch instead of three (or two). The stacking copies
    raw blocks, never dequantises.
    """

    def __init__(self, gpu: GPU, gguf: GGUFFile, names: list[str]) -> None:
        infos = [gguf.tensor(n) for n in names]
        self.fmt: QuantFormat = format_of(infos[0].ggml_type, names[0])
        self.cols = infos[0].dims[0]
        self.rows = sum(info.n_elements // self.cols for info in infos)
        self.nbytes = sum(info.nbytes for info in infos)
        label = "+".join(names)
        if self.nbytes > gpu.max_binding:
            raise AnyformerError(
                ErrorCode.OUT_OF_MEMORY,
                f"{label} is {self.nbytes} bytes, over the {gpu.max_binding} bytes one GPU binding may hold",
            )
        raw = gguf.raw(names[0]) if len(names) == 1 else np.concatenate([gguf.raw(n) for n in names])
        self.buffer = gpu.upload(raw, label=label)

    @staticmethod
    def can_stack(gpu: GPU, gguf: GGUFFile, names: list[str]) -> bool:
        """Whether these tensors share a type and a width and fit one binding together."""
        infos = [gguf.tensor(n) for n in names]
        same = all(i.ggml_type == infos[0].ggml_type and i.dims[0] == infos[0].dims[0] for i in infos)
        return same and sum(i.nbytes for i in infos) <= gpu.max_binding


#: Tensors stacked into one matrix per layer where they can be: (name of the stack, its members).
STACKS = (("attn_qkv", ("attn_q", "attn_k", "attn_v")), ("ffn_gate_up", ("ffn_gate", "ffn_up")))


def _vector(gpu: GPU, gguf: GGUFFile, name: str) -> Any:
    """A 1-D tensor (a norm's weights) as f32 on the GPU; these few-KB vectors are the only converted copies."""
    info = gguf.tensor(name)
    return gpu.upload(dequantize(gguf.raw(name), info.ggml_type).astype(np.float32), label=name)


class TransformerEngine:
    """A llama-family model on one GPU: KV cache for ``ctx`` positions, steps of up to ``max_batch`` tokens."""

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
        self.config: ModelConfig = read_config(gguf.header)
        c = self.config
        self.ctx = max(1, min(ctx, c.n_ctx_train))
        self.max_batch = max(1, max_batch)
        # An f16 KV cache where the adapter has shader-f16 (as llama.cpp's default), else f32.
        self.kernels = Kernels(gpu, kv_f16=gpu.has_f16 if kv_f16 is None else kv_f16)
        report = progress or (lambda what, done, total: None)
        names = [t.name for t in gguf.header.tensors]

        # Weights: raw blocks, one buffer per tensor or per stack of tensors.
        groups: dict[str, list[str]] = {}
        stacked: set[str] = set()
        for i in range(c.n_layer):
            for stack, members in STACKS:
                parts = [f"blk.{i}.{m}.weight" for m in members]
                if Weight.can_stack(gpu, gguf, parts):
                    groups[f"blk.{i}.{stack}.weight"] = parts
                    stacked.update(parts)
        for name in names:
            if len(gguf.tensor(name).dims) == 2 and name not in stacked:
                groups[name] = [name]
        self.weights: dict[str, Weight] = {}
        for done, (name, parts) in enumerate(groups.items(), 1):
            self.weights[name] = Weight(gpu, gguf, parts)
            report("upload", done, len(groups))
        self.norms = {n: _vector(gpu, gguf, n) for n in names if n.endswith("norm.weight")}
        self.head = self.weights["token_embd.weight" if c.tied_output else "output.weight"]

        # Activations, sized for max_batch tokens.
        b = self.max_batch
        buf = gpu.buffer
        self.h = buf(b * c.n_embd * 4, label="residual")
        self.qkv = buf(b * (c.q_dim + 2 * c.kv_dim) * 4, label="qkv")
        self.attn = buf(b * c.q_dim * 4, label="attention")
        self.gate_up = buf(b * 2 * c.n_ff * 4, label="gate-up")
        self.logits = buf(b * c.n_vocab * 4, label="logits")
        self.scores = buf(attention_scratch_bytes(b, c.n_head, self.ctx, c.head_dim), label="scores")
        self._step_buffers()
        kv_value = 2 if self.kernels.kv_f16 else 4
        self.k_cache = [buf(self.ctx * c.kv_dim * kv_value, label=f"k{i}") for i in range(c.n_layer)]
        self.v_cache = [buf(self.ctx * c.kv_dim * kv_value, label=f"v{i}") for i in range(c.n_layer)]
        factors = None
        if gguf.has("rope_freqs.weight"):
            info = gguf.tensor("rope_freqs.weight")
            factors = dequantize(gguf.raw("rope_freqs.weight"), info.ggml_type)[: c.n_rot // 2]
        self.cos_sin = gpu.upload(cos_sin_table(self.ctx, c.n_rot, c.rope_base, factors), label="rope")
        self._dummy_norm = gpu.buffer(16, label="no-qk-norm")
        self._qk_norm = [self._qk_norm_buffer(gguf, i) for i in range(c.n_layer)] if c.qk_norm else []
        self.gpu_bytes = self._held_bytes(gguf.header)
        # Pipelines compiled (and bind groups built) now rather than on the first token: the steps of
        # one token and of max_batch tokens use every pipeline variant any step needs.
        self.kernels.compile(self._pipelines_needed(), lambda done, total: report("compile", done, total))
        self._bind_programs(report)

    def _step_buffers(self) -> None:
        """The host side's small buffers (ids, step state, sampling, positions, read-back ring) and step state."""
        buf = self.gpu.buffer
        self.ids = buf((self.ctx + 1) * 4, label="ids")
        self.state = buf(16, label="state")
        self.sampling = buf(16, label="sampling")
        #: Every position as a u32: decode steps sharing one submission copy theirs into state[0] in turn.
        self.positions = self.gpu.upload(np.arange(self.ctx + 1, dtype=np.uint32), label="positions")
        self._readback: list[Any] = []
        self.readback(LAG + 1, 4 * STEPS)
        #: The steps bound at load, by (several tokens, split); see program().
        self._bound: dict[tuple[bool, bool], BoundProgram] = {}
        self.split_from = SPLIT_FROM
        #: Whether steps that sample draw at a temperature (set_sampling) rather than take the argmax.
        self.stochastic = False
        self._one_token: dict[tuple[bool, bool, bool, bool, bool], list[Dispatch]] = {}
        #: The position whose embedding the last sampling step left in the residual's first row (None: unknown).
        self._embedded_for: int | None = None

    @property
    def split_from(self) -> int:
        """Keys above which a step's attention splits along the sequence (see SPLIT_FROM)."""
        return self._split_from

    @split_from.setter
    def split_from(self, keys: int) -> None:
        # Lowered after load below the context: the split steps are compiled and bound now, not on a token.
        self._split_from = keys
        if self._bound and self.ctx > keys and (False, True) not in self._bound:
            self.kernels.compile(self.split_variants())
            self._bind_programs(lambda what, done, total: None)

    def readback(self, slots: int, nbytes: int) -> list[Any]:
        """``slots`` host-mappable buffers of at least ``nbytes`` (the decode loop's ring for ids read back late).

        Made at load for the loop's defaults; a caller asking for more or larger ones gets new ones.
        """
        if len(self._readback) < slots or self._readback[0].size < nbytes:
            self._readback = [self.gpu.staging(nbytes, label=f"readback{i}") for i in range(slots)]
        return self._readback[:slots]

    def _bind_programs(self, report: LoadProgress) -> None:
        """Bind the steps at load: of one token and of several, split along the sequence too where the context
        is long enough to need it. Each holds the step's layers, then the alternatives of its end (the
        head over the last token and over every token, the argmax and the sampler): every step is a
        choice among these (see :meth:`program`)."""
        wanted = [
            (several, split)
            for split in ((False, True) if self.ctx > self.split_from else (False,))
            for several in ((False, True) if self.max_batch > 1 else (False,))
        ]
        for done, (several, split) in enumerate(wanted, 1):
            if (several, split) in self._bound:
                continue
            n = self.max_batch if several else 1
            *layers, head, argmax = self._unbound(n, True, True, False, split)
            every_head = self._unbound(n, True, False, True, split)[-1]
            self.stochastic = True
            sampler = self._unbound(n, True, True, False, split)[-1]
            self.stochastic = False
            label = f"{'prefill' if several else 'decode'}{'-split' if split else ''}"
            specs = [*layers, head, every_head, argmax, sampler]
            self._bound[(several, split)] = BoundProgram(self.kernels, specs, label=label)
            report("bind", done, len(wanted))

    def _unbound(self, n: int, head: bool, sample: bool, all_logits: bool, split: bool) -> list[Dispatch]:
        """A step's dispatches, not bound (see :meth:`Kernels.unbound`)."""
        with self.kernels.unbound():
            return self._build(n, head, sample, all_logits, split)

    def split_attention(self, keys: int) -> bool:
        """Whether a step whose last token attends to ``keys`` keys splits attention along the sequence."""
        return keys > self.split_from

    def split_variants(self) -> list[PipelineKey]:
        """The split attention pipelines (and the combine) an engine with this context compiles at load."""
        if self.ctx <= self.split_from:
            return []
        name = attention_kernel(self.config.head_dim)
        wanted: list[PipelineKey] = [(name, None, 1, False, False, False, True)]
        if name == "attention_vec4":
            wanted.append((name, None, 1, False, False, True, True))  # with the rotary inside attention
        return wanted

    def _qk_norm_buffer(self, gguf: GGUFFile, layer: int) -> Any:
        q = dequantize(
            gguf.raw(f"blk.{layer}.attn_q_norm.weight"), gguf.tensor(f"blk.{layer}.attn_q_norm.weight").ggml_type
        )
        k = dequantize(
            gguf.raw(f"blk.{layer}.attn_k_norm.weight"), gguf.tensor(f"blk.{layer}.attn_k_norm.weight").ggml_type
        )
        return self.gpu.upload(np.concatenate([q, k]).astype(np.float32), label=f"qk-norm{layer}")

    @property
    def rope_in_projection(self) -> bool:
        """Whether the stacked q/k/v projection rotates and stores k, v itself (no rope_store dispatch).

        That epilogue pairs adjacent rows, so it serves llama's "normal" rope without q/k norms on a
        stacked projection whose workgroups hold row pairs; qwen3 (neox, q/k norms) keeps rope_store.
        """
        c = self.config
        k = self.kernels
        rows = c.n_head * c.head_dim + 2 * c.n_kv * c.head_dim
        layouts = [k.matrix_layout(rows, k.tokens_per_thread(n), rope=True) for n in (1, self.max_batch)]
        pairs = all((group // per_row) % 2 == 0 for group, per_row in layouts)
        stacked = all(f"blk.{i}.attn_qkv.weight" in self.weights for i in range(c.n_layer))
        return pairs and stacked and not c.rope_neox and not c.qk_norm and c.head_dim % 2 == 0 and c.n_rot % 2 == 0

    def _pipelines_needed(self) -> list[PipelineKey]:
        """Every (kernel, quant, tokens_per_thread, swiglu, norm, rope) pipeline the steps encode."""
        unused_attention = {"attention", "attention_vec4"} - {attention_kernel(self.config.head_dim)}
        if self.ctx <= self.split_from:
            unused_attention.add("attention_combine")
        rope_elsewhere = self.rope_in_projection or attention_kernel(self.config.head_dim) == "attention_vec4"
        # The samplers are compiled with the embedding's decoder (below): they also embed the next id.
        skip = {"swiglu", "rmsnorm", "argmax", "sample"} | unused_attention
        skip |= {"rope_store"} if rope_elsewhere else set()
        wanted: list[PipelineKey] = [(k, None, 1, False, False, False) for k in PLAIN_KERNELS if k not in skip]
        if not self.rope_in_projection and attention_kernel(self.config.head_dim) == "attention_vec4":
            wanted.append(("attention_vec4", None, 1, False, False, True))  # rotary inside attention
        for tokens in {1, self.max_batch}:
            for name, weight in self.weights.items():
                down = name.endswith("ffn_down.weight")
                normed = not down and not name.endswith("attn_output.weight")  # projections of the residual
                rope = self.rope_in_projection and name.endswith("attn_qkv.weight")
                key = self.kernels.matrix_key(weight.fmt.name, weight.rows, tokens, swiglu=down, norm=normed, rope=rope)
                wanted.append(key)
        embedding = self.weights["token_embd.weight"].fmt.name
        wanted += [(kernel, embedding, 1, False, False, False) for kernel in ("embed", "argmax", "sample")]
        return wanted + self.split_variants()

    def release(self) -> None:
        """Free the engine's GPU memory now (not when Python collects it); the engine is unusable after."""
        owned = [w.buffer for w in self.weights.values()] + list(self.norms.values()) + self.k_cache + self.v_cache
        owned += [self.h, self.qkv, self.attn, self.gate_up, self.logits, self.scores]
        owned += [self.ids, self.state, self.sampling, self.positions, self.cos_sin, self._dummy_norm, *self._qk_norm]
        self._release_programs()
        self.weights.clear()
        self.norms.clear()
        self.k_cache, self.v_cache = [], []
        for buf in owned:
            buf.destroy()

    def _release_programs(self) -> None:
        for bound in self._bound.values():
            bound.release()
        self._bound.clear()
        self._one_token.clear()

    def _held_bytes(self, header: GGUFHeader) -> int:
        """What this engine holds on the GPU, by the same arithmetic ``can_run`` estimates with."""
        return footprint(header.summary(), self.ctx, self.max_batch, kv_f16=self.kernels.kv_f16).gpu_bytes

    @property
    def dispatches_per_token(self) -> int:
        """How many kernel dispatches one decode step encodes (its input embedded by the step before)."""
        return len(self.program(1, head=True, chained=True))

    def program(
        self,
        tokens: int,
        *,
        head: bool,
        sample: bool = True,
        all_logits: bool = False,
        split: bool = False,
        chained: bool = False,
    ) -> list[Dispatch]:
        """The dispatches of one step over ``tokens`` tokens.

        ``head`` adds the final norm and output head (the last token's logits, or every token's with
        ``all_logits``); ``sample`` then adds sampling (the argmax, or a seeded draw after
        :meth:`set_sampling`), which writes the next id after the step's tokens. ``split`` makes each
        attention split along the sequence (one more dispatch per attention layer: the combine).
        The sampler also writes the next id's embedding into the residual's first row, so ``chained``
        leaves out the embedding lookup: a one-token step right after a sampling step needs none.

        Every step is made of the bind groups made at load; a step of several tokens writes its uniform
        blocks into the bound step's buffer (so call this right before submitting what it returns).
        """
        if not 1 <= tokens <= self.max_batch:
            raise ValueError(f"a step covers 1..{self.max_batch} tokens, not {tokens}")
        sample = head and sample
        several = tokens > 1
        every = head and all_logits and several  # one token's logits are every token's
        bound = self._bound.get((several, split))
        if bound is None:
            raise RuntimeError(f"no {'split ' if split else ''}step was bound at load for this context")
        stochastic = self.stochastic and sample
        if several:
            key = (tokens, head, sample, every, stochastic)
            return bound.shaped(
                key,
                lambda: (self._slots(bound, head, every, sample), self._unbound(tokens, head, sample, every, split)),
            )
        one = (head, sample, stochastic, split, chained)
        found = self._one_token.get(one)
        if found is None:
            slots = self._slots(bound, head, False, sample)
            if chained:
                if bound.dispatches[slots[0]].name != "embed":
                    raise RuntimeError("a step's first dispatch is its embedding lookup")
                slots = slots[1:]
            found = [bound.dispatches[i] for i in slots]
            self._one_token[one] = found
        return found

    def _slots(self, bound: BoundProgram, head: bool, every: bool, sample: bool) -> list[int]:
        """Which of a bound step's dispatches a step encodes: its layers, then the head over the last token (or
        every token) and the argmax (or the sampler, at a temperature); see :meth:`_bind_programs`."""
        layers = len(bound.dispatches) - 4
        slots = list(range(layers))
        if head:
            slots.append(layers + every)
        if sample:
            slots.append(layers + 2 + self.stochastic)
        return slots

    def _sampler(self, n: int, all_logits: bool) -> Dispatch:
        """The step's sampling dispatch (argmax, or a seeded draw after :meth:`set_sampling`) over the last
        token's logits, which also embeds the picked id for the next step."""
        k, vocab = self.kernels, self.config.n_vocab
        last = (n - 1) * vocab if all_logits else 0
        if self.stochastic:
            return k.sample(
                self.logits, self.ids, self.state, self.sampling, vocab, offset=last, embed=self._embed_next()
            )
        return k.argmax(self.logits, self.ids, self.state, vocab, offset=last, embed=self._embed_next())

    def _embed_next(self) -> EmbedNext:
        """Where the samplers write the picked id's embedding: the residual's first row (the next step's input)."""
        embd = self.weights["token_embd.weight"]
        return EmbedNext(embd.buffer, embd.fmt, embd.rows, embd.cols, self.h)

    def _build(self, n: int, head: bool, sample: bool, all_logits: bool, split: bool = False) -> list[Dispatch]:
        c, k, w = self.config, self.kernels, self.weights
        qkv_stride = c.q_dim + 2 * c.kv_dim
        embd = w["token_embd.weight"]
        out: list[Dispatch] = [k.embed(embd.buffer, embd.fmt, embd.rows, embd.cols, self.ids, self.h, self.state, n)]

        def mv(name: str, x: Any, y: Any, **kw: Any) -> Dispatch:
            m = w[name]
            return k.matvec(m.buffer, m.fmt, m.rows, m.cols, x, y, tokens=n, **kw)

        for i in range(c.n_layer):
            p = f"blk.{i}."
            # The projections normalise the residual themselves (RMSNorm fused into the matrix kernel).
            attn_norm = {"norm": self.norms[p + "attn_norm.weight"], "eps": c.eps}
            if self.rope_in_projection:
                # One dispatch: norm, q/k/v rows, rotation of q and k, and the k/v store into the cache.
                store = RopeStore(
                    self.k_cache[i], self.v_cache[i], self.cos_sin, self.state, c.head_dim, c.n_rot, c.q_dim, c.kv_dim
                )
                out.append(mv(p + "attn_qkv.weight", self.h, self.qkv, rope=store, **attn_norm))
            elif p + "attn_qkv.weight" in w:
                out.append(mv(p + "attn_qkv.weight", self.h, self.qkv, **attn_norm))  # rows q, k, v: the packed layout
            else:
                for name, off in (("attn_q", 0), ("attn_k", c.q_dim), ("attn_v", c.q_dim + c.kv_dim)):
                    out.append(mv(p + name + ".weight", self.h, self.qkv, y_off=off, y_stride=qkv_stride, **attn_norm))
            # The other models rotate and store in the attention dispatch itself (heads a multiple of 4 wide).
            rope_in_attention = not self.rope_in_projection and attention_kernel(c.head_dim) == "attention_vec4"
            if not self.rope_in_projection and not rope_in_attention:
                out.append(
                    k.rope_store(
                        self.qkv,
                        self.k_cache[i],
                        self.v_cache[i],
                        self.cos_sin,
                        self._qk_norm[i] if c.qk_norm else self._dummy_norm,
                        self.state,
                        n_head=c.n_head,
                        n_kv=c.n_kv,
                        head_dim=c.head_dim,
                        n_rot=c.n_rot,
                        neox=c.rope_neox,
                        tokens=n,
                        qk_norm=c.qk_norm,
                        eps=c.eps,
                    )
                )
            attention_args = (self.qkv, self.k_cache[i], self.v_cache[i], self.attn, self.scores, self.state)
            dims = {"n_head": c.n_head, "n_kv": c.n_kv, "head_dim": c.head_dim, "ctx": self.ctx}
            scale = 1.0 / math.sqrt(c.head_dim)
            rope = None
            if rope_in_attention:
                norm = self._qk_norm[i] if c.qk_norm else self._dummy_norm
                rope = AttentionRope(self.cos_sin, norm, c.n_rot, c.rope_neox, c.qk_norm, c.eps)
            out.append(k.attention_with_rope(rope, *attention_args, scale=scale, tokens=n, split=split, **dims))
            if split:
                out.append(
                    k.attention_combine(
                        self.scores, self.attn, self.state, n_head=c.n_head, head_dim=c.head_dim, ctx=self.ctx, tokens=n
                    )
                )
            out.append(mv(p + "attn_output.weight", self.attn, self.h, accumulate=True))
            ffn_norm = {"norm": self.norms[p + "ffn_norm.weight"], "eps": c.eps}
            if p + "ffn_gate_up.weight" in w:
                out.append(mv(p + "ffn_gate_up.weight", self.h, self.gate_up, **ffn_norm))  # rows gate, up
            else:
                for name, off in (("ffn_gate", 0), ("ffn_up", c.n_ff)):
                    out.append(
                        mv(p + name + ".weight", self.h, self.gate_up, y_off=off, y_stride=2 * c.n_ff, **ffn_norm)
                    )
            # The down projection reads silu(gate) * up straight from the [gate | up] rows.
            out.append(mv(p + "ffn_down.weight", self.gate_up, self.h, accumulate=True, swiglu=True))
        if head:
            # Decoding needs only the last token's logits; all_logits (for checks) keeps every token's.
            first = 0 if all_logits else n - 1
            norm = self.norms["output_norm.weight"]
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
                    norm=norm,
                    eps=c.eps,
                )
            )
        if sample:
            # The last token's logits are the last row of what the head wrote.
            out.append(self._sampler(n, all_logits))
        return out

    # The host side of one step: where it starts and how many tokens it covers.

    def set_sampling(self, temperature: float = 0.0, *, top_k: int = 40, top_p: float = 0.95, seed: int = 0) -> None:
        """Greedy steps (temperature 0), or top-k / top-p draws at ``temperature`` seeded by ``seed``, on the GPU."""
        self.stochastic = temperature > 0
        if self.stochastic:
            self.gpu.write(self.sampling, sampling_block(temperature, top_k, top_p, seed))

    def set_ids(self, ids: list[int] | np.ndarray, start: int = 0) -> None:
        """Write prompt ids into the GPU's id list at positions ``start..``."""
        arr = np.asarray(ids, dtype=np.uint32)
        if start + arr.size > self.ctx:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{start + arr.size} tokens exceed the context of {self.ctx}")
        if arr.size and int(arr.max()) >= self.config.n_vocab:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"token id {int(arr.max())} is outside the vocabulary")
        self.gpu.write(self.ids, arr, offset=4 * start)
        self._embedded_for = None

    def submit_step(
        self,
        pos: int,
        tokens: int,
        *,
        head: bool,
        sample: bool = True,
        all_logits: bool = False,
        copies: list[tuple[Any, int, Any, int, int]] | None = None,
    ) -> None:
        """Queue one step over ids[pos:pos+tokens] as one submission (see :meth:`program`).

        With ``sample`` the next id lands at ids[pos+tokens]; ``copies`` are appended to the same submission.
        """
        if tokens < 1 or tokens > self.max_batch:
            raise ValueError(f"a step covers 1..{self.max_batch} tokens, not {tokens}")
        if pos + tokens > self.ctx:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"position {pos + tokens} is past the context of {self.ctx}")
        self.gpu.write(self.state, np.array([pos, tokens, 0, 0], dtype=np.uint32))
        split = self.split_attention(pos + tokens)
        program = self.program(tokens, head=head, sample=sample, all_logits=all_logits, split=split)
        self._embedded_for = None
        self.kernels.run(program, copies or [])
        if head and sample:
            self._embedded_for = pos + tokens

    def submit_decode(self, pos: int, steps: int, *, copies: Sequence[Copy] = ()) -> None:
        """Queue ``steps`` one-token decode steps at positions pos.. as one submission (each samples the next id).

        Each step is its own compute pass, preceded by a copy of its position into the state buffer, so
        the host pays one submission (and one wait) for several tokens; ``copies`` come after the steps.
        """
        if steps < 1:
            raise ValueError(f"a submission covers at least one step, not {steps}")
        if pos + steps > self.ctx:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"position {pos + steps} is past the context of {self.ctx}")
        self.gpu.write(self.state, np.array([pos, 1, 0, 0], dtype=np.uint32))
        # Each step's sampler embeds the next id, so only a first step not preceded by one looks its id up.
        first = self.program(1, head=True, split=self.split_attention(pos + 1), chained=self._embedded_for == pos)
        passes: list[tuple[Sequence[Copy], Sequence[Dispatch]]] = [((), first)]
        for q in range(pos + 1, pos + steps):
            program = self.program(1, head=True, split=self.split_attention(q + 1), chained=True)
            passes.append((((self.positions, 4 * q, self.state, 0, 4),), program))
        self._embedded_for = None
        self.kernels.run_passes(passes, copies)
        self._embedded_for = pos + steps

    def prefill(self, ids: list[int], start: int = 0) -> None:
        """Run ids (already at ``start``) through the model in steps of ``max_batch``; the last step samples."""
        self.set_ids(ids, start)
        done = 0
        while done < len(ids):
            n = min(self.max_batch, len(ids) - done)
            self.submit_step(start + done, n, head=done + n == len(ids))
            done += n

    def read_logits(self, tokens: int = 1) -> np.ndarray:
        """The logits the last step's head wrote: ``tokens`` rows (1 unless it ran with ``all_logits``)."""
        vocab = self.config.n_vocab
        return self.gpu.read(self.logits, np.float32, tokens * vocab).reshape(tokens, vocab)

    def all_logits(self, ids: list[int]) -> np.ndarray:
        """Logits of every position of ``ids`` (a check against llama.cpp's ``logits_all``), in steps of max_batch."""
        self.set_ids(ids)
        rows = []
        for start in range(0, len(ids), self.max_batch):
            n = min(self.max_batch, len(ids) - start)
            self.submit_step(start, n, head=True, sample=False, all_logits=True)
            rows.append(self.read_logits(n))
        return np.concatenate(rows)

    def read_id(self, pos: int) -> int:
        """The id at position ``pos`` of the GPU's id list (waits for the GPU)."""
        return int(self.gpu.read(self.ids, np.uint32, 1, offset=4 * pos)[0])
