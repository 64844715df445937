"""Prompt steps of several tokens for the wgpu MoE engine (:class:`~anyformer_diskformer.engines.gpu.moe.GpuMoEEngine`).

A prompt runs in steps of up to :data:`PROMPT_STEP` tokens. Per layer, one submission holds the previous
layer's experts and this layer's attention over the step's tokens (the tiled matrix kernel for q/k/v and
the output, RoPE and the KV store for every token, attention causal over the step's tokens and the cache)
and the router's logits of every token, read back once. The host routes each token as the one-token step
does, and takes the union of the step's experts: each is fetched through the cache once, so a step reads
an expert from disk at most once however many of its tokens use it (one token a step read it again for
each token that missed it). The tokens routed to each expert are gathered (buffer copies of their
residual rows) into a block packed by expert; each expert's gate and up products (RMSNorm fused) and its
down product (SwiGLU fused) run over its own tokens with the tiled kernel; qwen2moe's shared expert runs
over every token; then one combine dispatch adds each token's router-weighted expert rows (and the shared
expert's, times its sigmoid gate) to its residual, in llama.cpp's order.

The cache's budget holds: when a step's union has more experts than the cache has slots, the experts are
fetched in groups that fit (those already held first, so none of them is evicted by the misses before its
turn), each group's products submitted before the next group's reads reuse its slots. The products queued
so far are submitted before each miss is read, so the GPU computes while the host reads, and the prefetcher's
reader threads read the next misses meanwhile (as the CPU engine's lookups do); its guess of the next layer's
experts is left to decoding (one token a step), where it is a few experts.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from anyformer_diskformer.arch.moe_config import EXPERT_TENSORS, MoEConfig
from anyformer_diskformer.cache.expert_cache import ExpertCache
from anyformer_diskformer.compute.routing import route_layer
from anyformer_diskformer.engines.gpu.layout import PROMPT_STEP
from anyformer_gguf_gpu.kernels import Copy, Dispatch, Kernels, combine_table
from anyformer_gguf_gpu.quants import QuantFormat, format_of

__all__ = ["PROMPT_STEP", "Fixed", "Pass", "PromptEngine", "PromptSteps", "SlotTable"]

if TYPE_CHECKING:
    from anyformer_gguf_gpu.gpu import GPU
    from anyformer_gguf_gpu.transformer import Weight


class SlotTable(Protocol):
    """The GPU slots an engine's expert cache stores into, as the prompt steps read them."""

    #: Bytes of one slot (an expert's three slabs).
    slot_bytes: int

    def slot(self, index: int) -> Any:
        """The slot at ``index``: its ``gate``, ``up``, ``down`` slabs and the weight ``types`` it holds now."""
        ...


class PromptEngine(Protocol):
    """What :class:`PromptSteps` reads of the engine it steps: its buffers, weights and one-token dispatches.

    :class:`~anyformer_diskformer.engines.gpu.moe.GpuMoEEngine` is one; naming it here instead of importing the
    engine keeps the engine and its prompt steps from importing each other.
    """

    gpu: GPU
    kernels: Kernels
    cache: ExpertCache[int]

    # Read-only here (properties), so an engine may hold a narrower config (Gemma 4's) or its own slot table.
    @property
    def config(self) -> MoEConfig:
        """The model's hyperparameters."""
        ...

    @property
    def slots(self) -> SlotTable:
        """The GPU slots its expert cache stores into."""
        ...

    #: Dense matrices by name, and norm vectors (GPU buffers) by tensor name.
    weights: dict[str, Weight]
    norms: dict[str, Any]
    #: Per-layer selection biases (``exp_probs_b``) of the layers that have one.
    probs_bias: dict[int, np.ndarray]
    #: The residual rows, the token ids and the step's (position, tokens) uniform.
    h: Any
    ids: Any
    state: Any

    def buffer(self, nbytes: int, label: str) -> Any:
        """A GPU buffer the engine owns (released with it)."""
        ...

    def mv(self, w: Weight, x: Any, y: Any, **kw: Any) -> Dispatch:
        """The dispatch of ``w`` times the rows of ``x`` into ``y``."""
        ...

    def attention_dispatches_for(self, i: int, tokens: int) -> list[Dispatch]:
        """Layer ``i``'s attention (or delta net) over ``tokens`` tokens."""
        ...

    def head_dispatch(self, token: int) -> Dispatch:
        """The output norm and head of the step's ``token``-th row into the logits."""
        ...

    def read_logits(self) -> np.ndarray:
        """The logits the head dispatch left."""
        ...


# Most tokens one prompt step covers (PROMPT_STEP, kept in layout, which the plan reads without importing wgpu):
# 32, because a step's 32 x top-k lookups already cover most of a layer's experts (Qwen3-30B-A3B: 256 lookups over
# 128 experts, about 110 distinct under uniform routing), so expert reads a token fall from top-k (8) to about 3.5,
# and 64 would only bring them to about 2 while the step's activations and attention scores (4 x tokens x heads x
# context bytes: 16 MiB at 4096 positions for Qwen3-30B) double.

#: A pass of a submission: the copies before it, its dispatches.
Pass = tuple[list[Copy], list[Dispatch]]


@dataclasses.dataclass
class Fixed:
    """The dispatches of a step over a given number of tokens that do not depend on routing (made once)."""

    embed: Dispatch
    #: Per layer: what runs before its router's logits are read back (attention, the router; Gemma 4's MLP).
    layers: list[list[Dispatch]]
    #: Per layer without a router: what follows ``layers`` (its FFN; Gemma 4's norm into the residual).
    dense: list[list[Dispatch]]
    #: Per MoE layer: the shared expert's products (queued before the routed experts').
    shared: list[list[Dispatch]]
    #: The combine of the experts' weighted rows.
    combine: Dispatch
    #: Per MoE layer: what follows the combine (Gemma 4's norms of the MLP and experts into the residual).
    finish: list[list[Dispatch]] = dataclasses.field(default_factory=list)
    #: Copies before a MoE layer's experts (Gemma 4 zeroes the rows its combine adds into).
    before_experts: list[Copy] = dataclasses.field(default_factory=list)


class PromptSteps:
    """The buffers and the host side of :class:`GpuMoEEngine`'s prompt steps of up to ``tokens`` tokens.

    An architecture with other layers (Gemma 4: :mod:`~anyformer_diskformer.engines.gpu.gemma4_prompt`) subclasses it
    and replaces :meth:`_build` (the step's fixed dispatches), :meth:`_route` (the combine weights), the experts'
    input norm (:meth:`_expert_norm`), their gate's activation (:attr:`gelu`) and the widths its buffers hold. One whose
    layers differ only before the FFN (qwen35moe's delta nets and gated attention) needs no subclass: its engine's
    ``attention_dispatches_for(layer, tokens)`` builds them over the step's tokens.
    """

    #: Whether the experts gate with GELU (Gemma 4) rather than SiLU.
    gelu = False

    def __init__(self, engine: PromptEngine, tokens: int) -> None:
        c = engine.config
        self.engine = engine
        self.tokens = tokens
        k = c.n_expert_used
        #: Rows each token adds back: its top-k experts' and the shared expert's.
        self.m = k + (1 if c.n_ff_shexp else 0)
        #: Floats of a token's router row (the routed experts' logits, then the shared expert's gate).
        self.width = self._router_width()
        buf = engine.buffer
        self.router = buf(4 * tokens * self.width, "prompt-router")
        self.x = buf(4 * tokens * k * c.n_embd, "prompt-expert-inputs")
        #: [gate | up] rows: the routed pairs' (packed by expert), then the shared expert's; a dense layer's.
        self._shared_gu = tokens * k * 2 * c.n_ff_exp
        dense_gu = tokens * 2 * self._dense_ff()
        self.gate_up = buf(4 * max(self._shared_gu + tokens * 2 * c.n_ff_shexp, dense_gu), "prompt-gate-up")
        self.out = buf(4 * tokens * self.m * c.n_embd, "prompt-expert-outputs")
        self.table = buf(8 * tokens * self.m, "prompt-combine-table")
        self._fixed: dict[int, Fixed] = {}
        self._compile()

    def _router_width(self) -> int:
        """Floats of a token's router row: the experts' logits and the shared expert's gate."""
        return self.engine.config.n_expert + 1

    def _dense_ff(self) -> int:
        """The widest dense FFN a step runs over its tokens (a leading dense layer's)."""
        return self.engine.config.n_ff

    def _expert_norm(self, layer: int) -> Any:
        """The GPU norm weights the experts' gate and up products normalise their input with."""
        c = self.engine.config
        return self.engine.norms[f"blk.{layer}.{c.ffn_norm}.weight"]

    def _compile(self) -> None:
        """Compile at load what a full step uses, so the first prompt does not wait for it: the step's fixed
        dispatches (made now), and the experts' tiled products for each weight type their tensors have."""
        e, k, c = self.engine, self.engine.kernels, self.engine.config
        self._fixed_for(self.tokens)
        wanted = []
        for (_, kind), span in e.cache.reader.spans.items():
            down = kind == EXPERT_TENSORS[2]
            quant, rows = format_of(span.ggml_type).name, c.n_embd if down else c.n_ff_exp
            # gate and up normalise their input (RMSNorm fused); down reads silu(gate) * up. An expert one token of
            # the step routes to runs the one-token kernel; the keys carry the shape a GPU gives each matrix.
            for tokens in (1, self.tokens):
                wanted.append(k.matrix_key(quant, rows, tokens, swiglu=down, norm=not down, gelu=down and self.gelu))
        k.compile(wanted)

    # Dispatches that depend only on the step's token count.

    def _fixed_for(self, n: int) -> Fixed:
        found = self._fixed.get(n)
        if found is None:
            if len(self._fixed) >= 4:
                self._fixed.clear()  # a prompt's last step has its own count: keep a few, not one per length
            found = self._fixed[n] = self._build(n)
        return found

    def _build(self, n: int) -> Fixed:
        e, c, k = self.engine, self.engine.config, self.engine.kernels
        embd = e.weights["token_embd.weight"]
        embed = k.embed(embd.buffer, embd.fmt, embd.rows, embd.cols, e.ids, e.h, e.state, n)
        layers, dense, shared = [], [], []
        for i in range(c.n_layer):
            p = f"blk.{i}."
            out = e.attention_dispatches_for(i, n)
            norm = {"norm": e.norms[p + c.ffn_norm + ".weight"], "eps": c.eps}
            if c.is_moe_layer(i):
                width = c.n_expert + 1
                out.append(e.mv(e.weights[p + "router"], e.h, self.router, tokens=n, y_stride=width, **norm))
                separate = e.weights.get(p + "ffn_gate_inp_shexp.weight")
                if separate is not None:
                    out.append(e.mv(separate, e.h, self.router, tokens=n, y_off=c.n_expert, y_stride=width, **norm))
            layers.append(out)
            dense.append([] if c.is_moe_layer(i) else self._swiglu(i, "", c.n_ff, 0, e.h, accumulate=True, n=n))
            moe_shared = c.n_ff_shexp > 0 and c.is_moe_layer(i)
            rows = n * c.n_expert_used  # the shared expert's rows follow the routed pairs' in the outputs
            shared.append(
                self._swiglu(i, "_shexp", c.n_ff_shexp, rows, self.out, accumulate=False, n=n) if moe_shared else []
            )
        combine = k.moe_combine(self.out, self.table, e.h, c.n_embd, self.m, tokens=n)
        return Fixed(embed, layers, dense, shared, combine, finish=[[] for _ in range(c.n_layer)])

    def _swiglu(
        self, i: int, suffix: str, n_ff: int, out_row: int, y: Any, *, accumulate: bool, n: int
    ) -> list[Dispatch]:
        """Layer ``i``'s dense SwiGLU FFN (``ffn_*{suffix}``) over the step's residual rows, its down product
        added to them (a leading dense layer) or written to ``y`` from row ``out_row`` (the shared expert)."""
        e, c = self.engine, self.engine.config
        p = f"blk.{i}."
        gate, up, down = (e.weights[p + f"ffn_{name}{suffix}.weight"] for name in ("gate", "up", "down"))
        norm = {"norm": e.norms[p + c.ffn_norm + ".weight"], "eps": c.eps}
        base = self._shared_gu if suffix else 0
        gu = {"tokens": n, "y_stride": 2 * n_ff}
        return [
            e.mv(gate, e.h, self.gate_up, y_off=base, **gu, **norm),
            e.mv(up, e.h, self.gate_up, y_off=base + n_ff, **gu, **norm),
            e.mv(
                down,
                self.gate_up,
                y,
                tokens=n,
                x_off=base,
                y_off=out_row * c.n_embd,
                accumulate=accumulate,
                swiglu=True,
            ),
        ]

    # One step.

    def step(self, pos: int, n: int, *, every: bool, head: bool) -> list[np.ndarray]:
        """Run ids[pos:pos+n] (already in the ids buffer); their logits rows (every token's with ``every``, else the
        last token's with ``head``, else none)."""
        e, c, gpu = self.engine, self.engine.config, self.engine.gpu
        gpu.write(e.state, np.array([pos, n, 0, 0], dtype=np.uint32))
        fixed = self._fixed_for(n)
        passes: list[Pass] = [([], [fixed.embed])]
        for layer in range(c.n_layer):
            passes[-1][1].extend(fixed.layers[layer])
            if not c.is_moe_layer(layer):
                passes[-1][1].extend(fixed.dense[layer])
                continue
            e.kernels.run_passes(passes)
            width = self.width
            logits = gpu.read(self.router, np.float32, n * width).reshape(n, width)
            chosen, scale = self._route(layer, logits)
            passes = self._experts(layer, chosen, scale, fixed)
            passes[-1][1].extend(fixed.finish[layer])
        rows: list[np.ndarray] = []
        if not head:
            e.kernels.run_passes(passes)
            return rows
        for t in range(n) if every else [n - 1]:
            passes[-1][1].append(e.head_dispatch(t))
            e.kernels.run_passes(passes)
            rows.append(e.read_logits())
            passes = [([], [])]
        return rows

    def _route(self, layer: int, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The step's experts (tokens x top-k) from its router rows, and each token's combine weights (tokens x m):
        the router weights, then the shared expert's gate."""
        c, k = self.engine.config, self.engine.config.n_expert_used
        chosen, weights = route_layer(c, logits[:, : c.n_expert], self.engine.probs_bias.get(layer))
        n = logits.shape[0]
        scale = np.zeros((n, self.m), dtype=np.float32)
        scale[:, :k] = weights
        if c.n_ff_shexp:
            shared = logits[:, c.n_expert].astype(np.float64)
            gate = 1.0 / (1.0 + np.exp(-shared)) if c.shexp_gated else np.ones(n)
            scale[:, k] = gate.astype(np.float32)
        return chosen, scale

    def _experts(self, layer: int, chosen: np.ndarray, scale: np.ndarray, fixed: Fixed) -> list[Pass]:
        """Fetch the union of the step's experts of ``layer`` (each once, in groups the cache holds) and queue
        their products over their tokens and the combine; the passes left to submit with the next layer."""
        e, c = self.engine, self.engine.config
        n, k = chosen.shape
        cache = e.cache
        # Packed by expert: each expert's (token, slot j) pairs in token order; held experts first, so a union larger
        # than the cache uses them before the misses evict them.
        union = list(dict.fromkeys(int(x) for x in chosen.reshape(-1)))
        union.sort(key=lambda x: (layer, x) not in cache)
        pairs: dict[int, list[tuple[int, int]]] = {x: [] for x in union}
        for t in range(n):
            for j in range(k):
                pairs[int(chosen[t, j])].append((t, j))
        rows = np.zeros((n, self.m), dtype=np.uint32)
        start: dict[int, int] = {}
        copies: list[Copy] = []
        row_bytes = 4 * c.n_embd
        for expert in union:
            start[expert] = len(copies)
            for t, j in pairs[expert]:
                rows[t, j] = len(copies)
                copies.append((e.h, t * row_bytes, self.x, len(copies) * row_bytes, row_bytes))
        if c.n_ff_shexp:
            rows[:, k] = n * k + np.arange(n)
        e.gpu.write(self.table, combine_table(rows, scale))
        group = max(1, cache.capacity_bytes // e.slots.slot_bytes)
        # The shared expert (its own rows of [gate | up] and outputs) goes first: the GPU computes it during the reads.
        passes: list[Pass] = [(fixed.before_experts + copies, list(fixed.shared[layer]))]
        for g0 in range(0, len(union), group):
            if g0:
                # This group's reads reuse the slots of the group before: its products go first.
                e.kernels.run_passes(passes)
                passes = [([], [])]
            members = union[g0 : g0 + group]
            # Held experts first, then the misses: the reader threads read the next misses while this one reads,
            # and the products queued so far are submitted before each read, so the GPU computes meanwhile.
            last = g0 + group >= len(union)
            missing = [(layer, x) not in cache for x in members]
            got = cache.fetch_each(layer, members, held_first=False, last=last, read_ahead=True)
            for i, (expert, slot) in enumerate(got):
                passes[-1][1].extend(self._expert(layer, slot, start[expert], len(pairs[expert])))
                if i + 1 < len(members) and missing[i + 1]:
                    e.kernels.run_passes(passes)
                    passes = [([], [])]
        passes[-1][1].append(fixed.combine)
        return passes

    def _expert(self, layer: int, slot: int, first: int, count: int) -> list[Dispatch]:
        """One expert's gate, up and down products over its ``count`` packed rows from row ``first``."""
        e, c, k = self.engine, self.engine.config, self.engine.kernels
        held = e.slots.slot(slot)
        f_gate, f_up, f_down = (format_of(t) for t in held.types)
        n_ff, n_embd = c.n_ff_exp, c.n_embd
        norm = self._expert_norm(layer)

        def gate_or_up(weight: Any, fmt: QuantFormat, half: int) -> Dispatch:
            # RMSNorm fused; the expert's rows of [gate | up] start at its first packed row.
            y_off = first * 2 * n_ff + half * n_ff
            x_off = first * n_embd
            y, x = self.gate_up, self.x
            return k.matvec(
                weight,
                fmt,
                n_ff,
                n_embd,
                x,
                y,
                tokens=count,
                x_off=x_off,
                y_off=y_off,
                y_stride=2 * n_ff,
                norm=norm,
                eps=c.eps,
            )

        return [
            gate_or_up(held.gate, f_gate, 0),
            gate_or_up(held.up, f_up, 1),
            k.matvec(
                held.down,
                f_down,
                n_embd,
                n_ff,
                self.gate_up,
                self.out,
                tokens=count,
                x_off=first * 2 * n_ff,
                y_off=first * n_embd,
                swiglu=True,
                gelu=self.gelu,
            ),
        ]
