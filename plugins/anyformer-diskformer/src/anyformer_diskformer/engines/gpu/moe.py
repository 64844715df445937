"""The MoE forward pass (qwen3moe, qwen2moe, bailingmoe, bailingmoe2) on wgpu: dense weights, the KV cache and the
expert cache's slots on the GPU. Gemma 4 (:mod:`~anyformer_diskformer.engines.gpu.gemma4`) and qwen35moe
(:mod:`~anyformer_diskformer.engines.gpu.qwen35moe`) are subclasses that replace the attention and FFN dispatches.

Every matrix product is the gguf-gpu library's quantised matrix kernel reading raw GGUF blocks (no
dequantised copy), dense tensors uploaded once at load, routed experts uploaded into GPU buffer
slots as the cache reads them from disk.

A token runs layer by layer. Per layer, one submission holds the previous layer's experts and this
layer's attention (RMSNorm fused into the q/k/v product, RoPE with the KV store, attention, the
output product added to the residual) and its router product; the residual is copied aside as the
experts' input and the router's logits are read back, because the host must know which experts to
read from disk. The host routes exactly as the CPU engine (softmax, top-k, renormalised where the
architecture says so), has the cache make the chosen experts resident (pinned, so none evicts
another), and queues each expert's three products: gate and up normalise the copied residual
themselves, and the router weight w is folded into up's norm weights (RMSNorm(x) · (norm · w)),
so silu(gate) · w·up is the weighted activation the down product adds straight into the residual.
qwen2moe's shared expert is three products more, its sigmoid gate folded the same way. A leading
dense layer (bailingmoe2) queues its SwiGLU FFN the same way with nothing read back. The KV cache
is f32, as the checks against llama.cpp's f32 cache want.

With ``cpu_threads`` (the ``cpu_experts`` load option) a decoding step uploads no missed expert: the
chosen experts the cache holds (or the prefetcher has read) run on the GPU as above, and the others
are computed on the CPU (:class:`~anyformer_diskformer.compute.expert_compute.ExpertRunner`) where they lie: in the
file mapped read-only (the page cache's own pages) with ``direct_io`` off, else through the cache's reader.
The residual after attention comes back in the same read as the router's logits, is normalised on the
host as the kernels normalise it, and the CPU experts' weighted sum goes up as one vector that a
one-row combine adds into the residual after the GPU experts (then the shared expert), the order the
sum had with every expert on the GPU. Misses never evict: while the cache has room the experts read
for the CPU are stored after the step's last layer is queued (off the critical path), after that only
the prefetcher's guesses (read on its threads) enter it. Prompt steps upload their misses as before.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_diskformer.arch.moe_config import EXPERT_TENSORS, MoEConfig
from anyformer_diskformer.cache.expert_cache import ExpertCache
from anyformer_diskformer.cache.expert_reader import DirectExpertReader, ExpertSlices, MappedExperts, expert_spans
from anyformer_diskformer.cache.prefetch import likely_experts
from anyformer_diskformer.compute.expert_compute import ExpertRunner
from anyformer_diskformer.compute.routing import route_layer, selection_scores
from anyformer_diskformer.engines.gpu.prompt import PROMPT_STEP, PromptSteps
from anyformer_diskformer.trace import TraceWriter
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.gpu import GPU
from anyformer_gguf_gpu.kernels import Dispatch, Kernels, combine_table
from anyformer_gguf_gpu.quants import F32, QuantFormat, dequantize, format_of
from anyformer_gguf_gpu.transformer import Weight, cos_sin_table


@dataclasses.dataclass
class _Slot:
    """One expert's place on the GPU: its three slabs, its scaled up-norm weights, and the types held now."""

    gate: Any
    up: Any
    down: Any
    norm: Any
    types: tuple[int, int, int] = (-1, -1, -1)


class GpuSlots:
    """The expert cache's store on the GPU: buffer slots, made as needed, reused after an eviction.

    Every slot is sized for the largest expert of any layer, so each costs the same bytes. A slot's
    three dispatches (gate, up, down) are built once per weight-type mix and reused.
    """

    def __init__(self, engine: GpuMoEEngine, slab_bytes: tuple[int, int, int]) -> None:
        self._engine = engine
        self._slab_bytes = slab_bytes
        self.slot_bytes = sum(slab_bytes)
        self._slots: list[_Slot] = []
        self._free: list[int] = []
        self._dispatches: dict[tuple[int, tuple[int, int, int]], list[Dispatch]] = {}

    def cost(self, slices: ExpertSlices) -> int:
        """A slot's bytes, whatever the expert's own size."""
        return self.slot_bytes

    def put(self, key: tuple[int, int], slices: ExpertSlices) -> int:
        """Upload ``slices`` into a free slot (a new one if none is free) and return the slot's index."""
        gpu = self._engine.gpu
        if self._free:
            index = self._free.pop()
        else:
            index = len(self._slots)
            g, u, d = self._slab_bytes
            label = f"expert-slot{index}"
            self._slots.append(
                _Slot(
                    gpu.buffer(g, label=label + "-gate"),
                    gpu.buffer(u, label=label + "-up"),
                    gpu.buffer(d, label=label + "-down"),
                    gpu.buffer(4 * self._engine.config.n_embd, label=label + "-norm"),
                )
            )
        slot = self._slots[index]
        gpu.write(slot.gate, slices.gate)
        gpu.write(slot.up, slices.up)
        gpu.write(slot.down, slices.down)
        slot.types = slices.types
        return index

    def slot(self, index: int) -> _Slot:
        """The slot ``index`` (its buffers and the weight types held now)."""
        return self._slots[index]

    def drop(self, key: tuple[int, int], entry: int) -> None:
        """The slot is free for the next expert read."""
        self._free.append(entry)

    def dispatches(self, index: int, scaled_norm: np.ndarray) -> list[Dispatch]:
        """The slot's gate, up and down products, its up-norm weights set to ``scaled_norm``."""
        slot = self._slots[index]
        e = self._engine
        e.gpu.write(slot.norm, scaled_norm)
        key = (index, slot.types)
        found = self._dispatches.get(key)
        if found is None:
            found = e.ffn_dispatches(
                [(slot.gate, format_of(slot.types[0])), (slot.up, format_of(slot.types[1]))],
                (slot.down, format_of(slot.types[2])),
                slot.norm,
                e.config.n_ff_exp,
            )
            self._dispatches[key] = found
        return found

    @property
    def gpu_bytes(self) -> int:
        """GPU bytes of the slots made so far."""
        return len(self._slots) * (self.slot_bytes + 4 * self._engine.config.n_embd)

    def release(self) -> None:
        """Free every slot's buffers now."""
        for slot in self._slots:
            for buf in (slot.gate, slot.up, slot.down, slot.norm):
                buf.destroy()
        self._slots.clear()
        self._free.clear()
        self._dispatches.clear()


class GpuMoEEngine:
    """A loaded qwen3moe, qwen2moe or bailingmoe(2) model on one GPU, the routed experts in a cache of GPU slots.

    A prompt runs in steps of up to ``prompt_step`` tokens (:mod:`~anyformer_diskformer.engines.gpu.prompt`); 1 runs
    it a token a step, as decoding does.
    """

    #: Whether prompts run several tokens a step (every engine here does; a subclass without a several-token step
    #: sets it False).
    batched_prompts = True

    def __init__(
        self,
        gpu: GPU,
        gguf: GGUFFile,
        config: MoEConfig,
        make_cache: Callable[[GpuSlots], ExpertCache[int]],
        ctx: int,
        trace: TraceWriter | None = None,
        prompt_step: int = PROMPT_STEP,
        cpu_threads: int = 0,
    ) -> None:
        if cpu_threads and type(self) is not GpuMoEEngine:
            # Gemma 4's and qwen35moe's engines replace the FFN dispatches this split relies on.
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"cpu_experts is not supported for the {config.architecture} architecture"
            )
        if cpu_threads < 0:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"cpu_threads must be at least 0, not {cpu_threads}")
        #: Decoding computes the experts the cache misses on the CPU, on this many threads (0: uploads them).
        self.cpu_threads = cpu_threads
        self.runner: ExpertRunner | None = None
        self.mapped: MappedExperts | None = None
        if prompt_step < 1:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"a prompt step covers at least one token, not {prompt_step}")
        #: Most tokens a prompt step covers (1 where the architecture runs prompts a token a step).
        self.prompt_step = min(prompt_step, ctx) if self.batched_prompts else 1
        #: The prompt steps' buffers and host side (None: one token a step).
        self.prompt: PromptSteps | None = None
        self.gpu = gpu
        self.config = config
        self.trace = trace
        self.ctx = ctx
        self.kernels = Kernels(gpu, kv_f16=False)
        self._owned: list[Any] = []
        self.weights: dict[str, Weight] = {}
        try:
            self._build(gguf, make_cache)
        except BaseException:
            # A load that fails part way (out of GPU memory, a bad tensor) frees what it made.
            cache: ExpertCache[int] | None = getattr(self, "cache", None)
            if cache is not None:
                cache.close()
            self.release()
            raise

    def _build(self, gguf: GGUFFile, make_cache: Callable[[GpuSlots], ExpertCache[int]]) -> None:
        c, ctx, trace = self.config, self.ctx, self.trace
        self._load_weights(gguf)
        spans = expert_spans(gguf, c.n_layer, c.n_expert)
        slab = tuple(max(span.length for (_, k), span in spans.items() if k == kind) for kind in EXPERT_TENSORS)
        self.slots = GpuSlots(self, (slab[0], slab[1], slab[2]))
        #: The expert cache, its store the GPU slots.
        self.cache = make_cache(self.slots)
        if trace is not None:
            self.cache.take_accesses()  # start recording
        buf = self.buffer
        # The residual, q/k/v, attention and score rows hold a prompt step's tokens (decoding uses the first).
        n = self.prompt_step
        self.h = buf(4 * n * c.n_embd, "residual")
        self.h_ffn = buf(4 * c.n_embd, "expert-input")
        self.qkv = buf(4 * n * self._qkv_floats(), "qkv")
        self.attn = buf(4 * n * c.q_dim, "attention")
        self.gate_up = buf(8 * max(c.n_ff_exp, c.n_ff_shexp, c.n_ff), "gate-up")
        # This layer's router logits (and the shared expert's gate), then the next layer's router on this
        # layer's residual: the prefetcher's guess.
        # With cpu_threads the residual after attention follows them: one read brings back both.
        self._h_at = 2 * (c.n_expert + 1)
        self.router = buf(4 * (self._h_at + (c.n_embd if self.cpu_threads else 0)), "router")
        self.logits = buf(4 * c.n_vocab, "logits")
        self.scores = buf(4 * n * c.n_head * ctx, "scores")
        self.ids = buf(4 * (ctx + 1), "ids")
        self.state = buf(16, "state")
        self.gate_norm = buf(4 * c.n_embd, "gate-norm")
        self.shexp_norm = buf(4 * c.n_embd, "shared-up-norm")
        self.ones = self._upload(np.ones(1, dtype=np.float32), "ones")
        # KV rows for the layers that attend only (qwen35moe's delta nets keep states instead): None elsewhere.
        attending = [not c.is_recurrent(i) for i in range(c.n_layer)]
        self.k_cache = [buf(4 * ctx * c.kv_dim, f"k{i}") if on else None for i, on in enumerate(attending)]
        self.v_cache = [buf(4 * ctx * c.kv_dim, f"v{i}") if on else None for i, on in enumerate(attending)]
        self.cos_sin = self._upload(self._rope_table(), "rope")
        self._embed = self._embed_dispatch()
        self._layers = [self._layer_dispatches(i) for i in range(c.n_layer)]
        shared = c.n_ff_shexp > 0
        self._shared = [self._shared_dispatches(i) if shared and c.is_moe_layer(i) else [] for i in range(c.n_layer)]
        self._dense = [self._dense_dispatches(i) for i in range(c.n_dense_lead)]
        self._head = self.head_dispatch(0)
        if n > 1:
            self.prompt = PromptSteps(self, n)
        if self.cpu_threads:
            self._build_cpu_experts()

    def _build_cpu_experts(self) -> None:
        """The CPU side of ``cpu_threads``: the expert runner (its compiled products ready now, not on the first
        token), the buffer its weighted sum is written to, and the combine that adds it to the residual."""
        from anyformer_diskformer.compute import native_products

        c = self.config
        reader = self.cache.reader
        native_products.compile_for({span.ggml_type for span in reader.spans.values()})  # the experts' types only
        self.runner = ExpertRunner(self.cpu_threads, c.n_embd, c.n_ff_exp)
        if not isinstance(reader, DirectExpertReader) and not reader.note:
            # direct_io off: the CPU multiplies the experts in the page cache's own pages, with no copy and
            # nothing dropped (the pread reader would drop what it read). With O_DIRECT (asked for and working)
            # the CPU's reads go through the cache's reader, as the uploads do.
            self.mapped = MappedExperts(reader.paths, reader.spans)
            # The page cache is where the CPU finds the experts now: the reads for the GPU (the prefetcher's, the
            # warm-up's) must not push them out of it.
            reader.drop_pages = False
        self.cpu_out = self.buffer(4 * c.n_embd, "cpu-experts")
        # One row (0) of weight 1: h += 1.0 * v adds v exactly.
        table = self._upload(combine_table(np.zeros((1, 1), dtype=np.int64), np.ones((1, 1))), "cpu-experts-table")
        self._add_cpu = self.kernels.moe_combine(self.cpu_out, table, self.h, c.n_embd, 1, tokens=1)

    def head_dispatch(self, token: int) -> Dispatch:
        """The output norm and head over residual row ``token`` into the logits."""
        c = self.config
        head = self.weights["token_embd.weight" if c.tied_output else "output.weight"]
        norm = self.norms["output_norm.weight"]
        return self.mv(head, self.h, self.logits, x_off=token * c.n_embd, norm=norm, eps=c.eps)

    def _qkv_floats(self) -> int:
        """Floats of the q/k/v rows of a token (the widest layer's)."""
        return self.config.q_dim + 2 * self.config.kv_dim

    def _rope_table(self) -> np.ndarray:
        """The rotary table the layers read: (cos, sin) per position and pair."""
        return cos_sin_table(self.ctx, self.config.n_rot, self.config.rope_base)

    # Load: weights as raw blocks, norms as f32.

    def buffer(self, nbytes: int, label: str) -> Any:
        """A GPU buffer of ``nbytes`` the engine owns (released with it)."""
        found = self.gpu.buffer(nbytes, label=label)
        self._owned.append(found)
        return found

    def _upload(self, data: np.ndarray, label: str) -> Any:
        found = self.gpu.upload(data, label=label)
        self._owned.append(found)
        return found

    def _load_weights(self, gguf: GGUFFile) -> None:
        c = self.config
        matrices: list[tuple[str, list[str]]] = [("token_embd.weight", ["token_embd.weight"])]
        if not c.tied_output:
            matrices.append(("output.weight", ["output.weight"]))
        for i in range(c.n_layer):
            p = f"blk.{i}."
            matrices += self._attention_matrices(gguf, i)
            if not c.is_moe_layer(i):
                matrices += [(p + f"ffn_{n}.weight", [p + f"ffn_{n}.weight"]) for n in ("gate", "up", "down")]
                continue
            router = [p + "ffn_gate_inp.weight"]
            if c.n_ff_shexp:
                matrices += [
                    (p + f"ffn_{n}_shexp.weight", [p + f"ffn_{n}_shexp.weight"]) for n in ("gate", "up", "down")
                ]
            if c.shexp_gated:
                # The shared expert's gate is one more router row: its logit comes back with the router's.
                shared_gate = p + "ffn_gate_inp_shexp.weight"
                if Weight.can_stack(self.gpu, gguf, [*router, shared_gate]):
                    router.append(shared_gate)
                else:
                    matrices.append((shared_gate, [shared_gate]))
            matrices.append((p + "router", router))
        for name, parts in matrices:
            weight = Weight(self.gpu, gguf, parts)
            self._owned.append(weight.buffer)
            self.weights[name] = weight
        self.norms: dict[str, Any] = {}
        self._host_norms: dict[str, np.ndarray] = {}
        #: Each MoE layer's expert-selection bias (exp_probs_b), used on the host where it routes.
        self.probs_bias: dict[int, np.ndarray] = {}
        for t in gguf.header.tensors:
            if t.name.endswith("exp_probs_b.bias"):
                self.probs_bias[int(t.name.split(".")[1])] = dequantize(gguf.raw(t.name), t.ggml_type)
            if t.name.endswith("norm.weight"):
                values = dequantize(gguf.raw(t.name), t.ggml_type).astype(np.float32)
                self._host_norms[t.name] = values
                self.norms[t.name] = self._upload(values, t.name)
        self._qk_norm = [
            self._upload(
                np.concatenate(
                    [self._host_norms[f"blk.{i}.attn_q_norm.weight"], self._host_norms[f"blk.{i}.attn_k_norm.weight"]]
                ),
                f"qk-norm{i}",
            )
            if c.qk_norm and f"blk.{i}.attn_q_norm.weight" in self._host_norms
            else self._upload(np.zeros(4, dtype=np.float32), "no-qk-norm")
            for i in range(c.n_layer)
        ]
        # q/k/v biases as a one-column F32 matrix times a one: the matrix kernel adds them to the products.
        self._bias = (
            [
                self._upload(
                    np.concatenate(
                        [
                            dequantize(
                                gguf.raw(f"blk.{i}.attn_{n}.bias"), gguf.tensor(f"blk.{i}.attn_{n}.bias").ggml_type
                            )
                            for n in "qkv"
                        ]
                    ).astype(np.float32),
                    f"qkv-bias{i}",
                )
                for i in range(c.n_layer)
            ]
            if c.qkv_bias
            else []
        )

    def _attention_matrices(self, gguf: GGUFFile, i: int) -> list[tuple[str, list[str]]]:
        """Layer ``i``'s attention matrices to upload, (name, stacked tensors): q/k/v stacked where they can be."""
        p = f"blk.{i}."
        qkv = [p + f"attn_{n}.weight" for n in "qkv"]
        out = [(p + "attn_output.weight", [p + "attn_output.weight"])]
        if self.config.fused_qkv:
            return [(p + "attn_qkv.weight", [p + "attn_qkv.weight"]), *out]
        if Weight.can_stack(self.gpu, gguf, qkv):
            return [(p + "attn_qkv.weight", qkv), *out]
        return [*((n, [n]) for n in qkv), *out]

    # Dispatches, built once.

    def mv(self, w: Weight, x: Any, y: Any, **kw: Any) -> Dispatch:
        """The dispatch of ``w`` times the rows of ``x`` into ``y`` (``kw``: the matvec kernel's options)."""
        return self.kernels.matvec(w.buffer, w.fmt, w.rows, w.cols, x, y, **kw)

    def _embed_dispatch(self) -> Dispatch:
        w = self.weights["token_embd.weight"]
        return self.kernels.embed(w.buffer, w.fmt, w.rows, w.cols, self.ids, self.h, self.state, 1)

    def _layer_dispatches(self, i: int) -> list[Dispatch]:
        """Layer ``i``'s attention added to the residual, then its router's logits of the normalised residual."""
        c, p = self.config, f"blk.{i}."
        out = self._attention_dispatches(i)
        if not c.is_moe_layer(i):
            # A dense layer: no router; its FFN is queued by the step. Before a MoE layer (a leading dense block's
            # last) the next router's guess is made here, or nothing would start that layer's reads early.
            if self.cache.prefetcher is not None and i + 1 < c.n_layer and c.is_moe_layer(i + 1):
                q = f"blk.{i + 1}."
                next_norm = {"norm": self.norms[q + c.ffn_norm + ".weight"], "eps": c.eps}
                out.append(self.mv(self.weights[q + "router"], self.h, self.router, y_off=c.n_expert + 1, **next_norm))
            return out
        ffn_norm = {"norm": self.norms[p + c.ffn_norm + ".weight"], "eps": c.eps}
        out.append(self.mv(self.weights[p + "router"], self.h, self.router, **ffn_norm))
        separate = self.weights.get(p + "ffn_gate_inp_shexp.weight")
        if separate is not None:
            out.append(self.mv(separate, self.h, self.router, y_off=c.n_expert, **ffn_norm))
        if self.cache.prefetcher is not None and i + 1 < c.n_layer:
            q = f"blk.{i + 1}."
            next_norm = {"norm": self.norms[q + c.ffn_norm + ".weight"], "eps": c.eps}
            out.append(self.mv(self.weights[q + "router"], self.h, self.router, y_off=c.n_expert + 1, **next_norm))
        return out

    def _attention_dispatches(self, i: int) -> list[Dispatch]:
        """Layer ``i``'s attention (RMSNorm fused into q/k/v, rope and KV store, attention, output) added to h."""
        return self.attention_dispatches_for(i, 1)

    def attention_dispatches_for(self, i: int, tokens: int) -> list[Dispatch]:
        """:meth:`_attention_dispatches` over ``tokens`` tokens at positions state[0].. (causal among them)."""
        c, p, k = self.config, f"blk.{i}.", self.kernels
        qkv_stride = c.q_dim + 2 * c.kv_dim
        norm = {"norm": self.norms[p + "attn_norm.weight"], "eps": c.eps, "tokens": tokens}
        out: list[Dispatch] = []
        if p + "attn_qkv.weight" in self.weights:
            out.append(self.mv(self.weights[p + "attn_qkv.weight"], self.h, self.qkv, **norm))
        else:
            for name, off in (("attn_q", 0), ("attn_k", c.q_dim), ("attn_v", c.q_dim + c.kv_dim)):
                w = self.weights[p + name + ".weight"]
                out.append(self.mv(w, self.h, self.qkv, y_off=off, y_stride=qkv_stride, **norm))
        if c.qkv_bias:
            # Every token adds the same bias column: its one input is read with stride 0.
            out.append(
                k.matvec(
                    self._bias[i],
                    F32,
                    qkv_stride,
                    1,
                    self.ones,
                    self.qkv,
                    tokens=tokens,
                    x_stride=0,
                    y_stride=qkv_stride,
                    accumulate=True,
                )
            )
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
                qk_norm=c.qk_norm,
                eps=c.eps,
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
                n_head=c.n_head,
                n_kv=c.n_kv,
                head_dim=c.head_dim,
                ctx=self.ctx,
                scale=1.0 / math.sqrt(c.head_dim),
                tokens=tokens,
            )
        )
        out.append(self.mv(self.weights[p + "attn_output.weight"], self.attn, self.h, accumulate=True, tokens=tokens))
        return out

    def ffn_dispatches(
        self, gate_up: list[tuple[Any, QuantFormat]], down: tuple[Any, QuantFormat], up_norm: Any, n_ff: int
    ) -> list[Dispatch]:
        """One SwiGLU expert over the copied residual: gate (norm weights), up (``up_norm``), down added to h."""
        c, k = self.config, self.kernels
        (gate, gate_fmt), (up, up_fmt) = gate_up
        return [
            k.matvec(gate, gate_fmt, n_ff, c.n_embd, self.h_ffn, self.gate_up, norm=self.gate_norm, eps=c.eps),
            k.matvec(up, up_fmt, n_ff, c.n_embd, self.h_ffn, self.gate_up, y_off=n_ff, norm=up_norm, eps=c.eps),
            k.matvec(down[0], down[1], c.n_embd, n_ff, self.gate_up, self.h, accumulate=True, swiglu=True),
        ]

    def _dense_dispatches(self, i: int) -> list[Dispatch]:
        """A leading dense layer's SwiGLU FFN (its up product normalises with the layer's own ffn_norm)."""
        p = f"blk.{i}."
        gate, up, down = (self.weights[p + f"ffn_{n}.weight"] for n in ("gate", "up", "down"))
        return self.ffn_dispatches(
            [(gate.buffer, gate.fmt), (up.buffer, up.fmt)],
            (down.buffer, down.fmt),
            self.norms[p + self.config.ffn_norm + ".weight"],
            self.config.n_ff,
        )

    def _shared_dispatches(self, i: int) -> list[Dispatch]:
        p = f"blk.{i}."
        gate, up, down = (self.weights[p + f"ffn_{n}_shexp.weight"] for n in ("gate", "up", "down"))
        return self.ffn_dispatches(
            [(gate.buffer, gate.fmt), (up.buffer, up.fmt)],
            (down.buffer, down.fmt),
            self.shexp_norm,
            self.config.n_ff_shexp,
        )

    # Steps.

    @property
    def held_bytes(self) -> int:
        """GPU bytes of the dense weights, norms, KV cache and activations (the slots count their own)."""
        return sum(int(b.size) for b in self._owned)

    def forward(self, ids: list[int], start: int, *, every: bool = True) -> np.ndarray:
        """Logits for ``ids`` at positions ``start..`` (every token's rows, or only the last's): several tokens
        in steps of up to :attr:`prompt_step`, one token a step otherwise."""
        c = self.config
        if start < 0 or start + len(ids) > self.ctx:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"positions {start}..{start + len(ids)} exceed {self.ctx}")
        if any(not 0 <= t < c.n_vocab for t in ids):
            raise AnyformerError(ErrorCode.BAD_REQUEST, "a token id is outside the vocabulary")
        self.gpu.write(self.ids, np.asarray(ids, dtype=np.uint32), offset=4 * start)
        rows = []
        if self.prompt is not None and len(ids) > 1:
            n = self.prompt_step
            for first in range(0, len(ids), n):
                last = first + n >= len(ids)
                count = min(n, len(ids) - first)
                rows += self.prompt.step(start + first, count, every=every, head=every or last)
                if self.trace is not None:
                    self.trace.write(self.cache.take_accesses())  # one line a step, as decoding writes
            return np.stack(rows)
        for n in range(len(ids)):
            logits = self._step(start + n, head=every or n == len(ids) - 1)
            if logits is not None:
                rows.append(logits)
        if self.trace is not None:
            self.trace.write(self.cache.take_accesses())
        return np.stack(rows)

    def _step(self, pos: int, *, head: bool) -> np.ndarray | None:
        c, gpu = self.config, self.gpu
        gpu.write(self.state, np.array([pos, 1, 0, 0], dtype=np.uint32))
        pending = [self._embed]
        copy = [(self.h, 0, self.h_ffn, 0, 4 * c.n_embd)]
        if self.cpu_threads:
            copy.append((self.h, 0, self.router, 4 * self._h_at, 4 * c.n_embd))
        #: Experts read for the CPU this step, stored in the cache after the last layer is queued (while it has room).
        admit: list[tuple[int, int, ExpertSlices]] = []
        for layer in range(c.n_layer):
            self.kernels.run(pending + self._layers[layer], copy)
            norm = self._host_norms[f"blk.{layer}.{c.ffn_norm}.weight"]
            prefetcher = self.cache.prefetcher
            if not c.is_moe_layer(layer):
                # A leading dense layer: nothing to route; before a MoE layer its guess is read back and its
                # reads start now, overlapping this layer's MLP (no lookup here would start them).
                gpu.write(self.gate_norm, norm)
                if prefetcher is not None and layer + 1 < c.n_layer and c.is_moe_layer(layer + 1):
                    guess = gpu.read(self.router, np.float32, 2 * c.n_expert + 1)[None, c.n_expert + 1 :]
                    self._guess(layer + 1, guess, prefetcher)
                    prefetcher.start(layer)
                pending = list(self._dense[layer])
                continue
            guessing = prefetcher is not None and layer + 1 < c.n_layer
            if self.cpu_threads:
                logits = gpu.read(self.router, np.float32, self._h_at + c.n_embd)
            else:
                logits = gpu.read(self.router, np.float32, 2 * c.n_expert + 1 if guessing else c.n_expert + 1)
            if prefetcher is not None and guessing:
                self._guess(layer + 1, logits[None, c.n_expert + 1 : 2 * c.n_expert + 1], prefetcher)
            chosen, weights = route_layer(c, logits[None, : c.n_expert], self.probs_bias.get(layer))
            experts = [int(e) for e in chosen[0]]
            gpu.write(self.gate_norm, norm)
            pending = []
            if self.cpu_threads:
                pending += self._split_experts(layer, experts, weights[0], logits[self._h_at :], norm, admit)
            else:
                for slot, weight in zip(self.cache.fetch(layer, experts), weights[0], strict=True):
                    pending += self.slots.dispatches(slot, norm * np.float32(weight))
            if c.n_ff_shexp:
                gate = np.float32(1.0 / (1.0 + np.exp(-np.float64(logits[c.n_expert])))) if c.shexp_gated else 1
                gpu.write(self.shexp_norm, norm * np.float32(gate))
                pending += self._shared[layer]
        if not head:
            self.kernels.run(pending)
            self._admit(admit)
            return None
        self.kernels.run([*pending, self._head])
        self._admit(admit)  # the GPU runs the last layer and the head meanwhile
        return self.read_logits()

    def _split_experts(
        self,
        layer: int,
        experts: list[int],
        weights: np.ndarray,
        h: np.ndarray,
        norm: np.ndarray,
        admit: list[tuple[int, int, ExpertSlices]],
    ) -> list[Dispatch]:
        """``cpu_threads``: the dispatches of ``layer``'s chosen experts the cache holds (or the prefetcher has
        read), then the one that adds the others' weighted sum, computed here on the CPU from the residual ``h``.

        The GPU experts are queued in routing order, the CPU sum after them: the CPU terms are summed in routing
        order among themselves, so the residual gets the same terms as with every expert on the GPU.
        """
        c = self.config
        on_gpu = [i for i, e in enumerate(experts) if self.cache.ready(layer, e)]
        on_cpu = [i for i in range(len(experts)) if i not in on_gpu]
        # Held ones first and pinned, so taking a prefetched one cannot evict another chosen one.
        got = dict(self.cache.fetch_each(layer, [experts[i] for i in on_gpu]))
        out: list[Dispatch] = []
        for i in on_gpu:
            out += self.slots.dispatches(got[experts[i]], norm * np.float32(weights[i]))
        if not on_cpu:
            return out
        cpu_experts = [experts[i] for i in on_cpu]
        self.cache.bypass(layer, cpu_experts)
        # The FFN input as the kernels normalise it: RMSNorm over f32 with the ffn_norm weights.
        x = (h / np.sqrt(np.mean(h.astype(np.float64) ** 2) + c.eps) * norm).astype(np.float32)
        runner = self.runner
        assert runner is not None
        reader = self.mapped if self.mapped is not None else self.cache.reader
        total, loaded = runner.weighted_sum(
            lambda e: reader.read(layer, e), cpu_experts, [float(weights[i]) for i in on_cpu], x
        )
        self.cache.stats.bytes_read += sum(s.nbytes for s in loaded)  # from the page cache when mapped
        room = len(admit)
        for e, slices in zip(cpu_experts, loaded, strict=True):
            if self.cache.room_for(room + 1):
                admit.append((layer, e, slices))
                room += 1
        self.gpu.write(self.cpu_out, total)
        return [*out, self._add_cpu]

    def _admit(self, admit: list[tuple[int, int, ExpertSlices]]) -> None:
        """Store the experts read for the CPU this step in the cache while it has room (never evicting)."""
        for layer, expert, slices in admit:
            self.cache.admit(layer, expert, slices)
        admit.clear()

    def read_logits(self) -> np.ndarray:
        """The logits the head dispatch last wrote (Gemma 4 soft-caps them here)."""
        return self.gpu.read(self.logits, np.float32, self.config.n_vocab)

    def _guess(self, layer: int, router_logits: np.ndarray, prefetcher: Any) -> None:
        """Have the prefetcher read ``layer``'s likely experts from its router's logits [1, n_expert]."""
        c = self.config
        scores = selection_scores(c, router_logits, self.probs_bias.get(layer))
        likely = likely_experts(scores, c.n_expert_used, prefetcher.width)
        self.cache.expect(layer, likely)
        prefetcher.request(layer, likely, self.cache)

    def checkpoint(self, n: int) -> list[Any]:
        """GPU copies of every layer's keys and values of positions 0..n-1 (see :meth:`restore`)."""
        nbytes = 4 * n * self.config.kv_dim
        caches = self._kv_buffers()
        saved = [self.buffer(nbytes, "kv-checkpoint") for _ in caches]
        self.kernels.run([], [(cache, 0, copy, 0, nbytes) for cache, copy in zip(caches, saved, strict=True)])
        return saved

    def _kv_buffers(self) -> list[Any]:
        """The K then the V buffers of the layers that attend."""
        return [b for b in self.k_cache + self.v_cache if b is not None]

    def restore(self, saved: list[Any], n: int) -> None:
        """Put back the first ``n`` positions of a :meth:`checkpoint` (queued before the next step)."""
        nbytes = 4 * n * self.config.kv_dim
        caches = self._kv_buffers()
        self.kernels.run([], [(copy, 0, cache, 0, nbytes) for cache, copy in zip(caches, saved, strict=True)])

    def forget(self, saved: list[Any]) -> None:
        """Free a checkpoint's buffers."""
        for buf in saved:
            self._owned.remove(buf)
            buf.destroy()

    def release(self) -> None:
        """Free every GPU buffer now; the engine is unusable after."""
        runner: ExpertRunner | None = getattr(self, "runner", None)
        if runner is not None:
            runner.close()
        mapped: MappedExperts | None = getattr(self, "mapped", None)
        if mapped is not None:
            mapped.close()
        slots: GpuSlots | None = getattr(self, "slots", None)
        if slots is not None:
            slots.release()
        for b in self._owned:
            b.destroy()
        self._owned.clear()
        self.weights.clear()
