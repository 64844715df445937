"""What a load would hold: dense weights, the KV cache, the expert cache, and the smallest cache that works.

``can_run`` plans from the core's header summary, never opening the file: its ``tensor_bytes``
give the experts' and dense weights' bytes (:func:`plan_from_tensor_bytes`); an older summary
without them is estimated from the shapes and the bytes per parameter (:func:`plan_from_summary`),
and a description without any header from the architecture's rough shape over the file sizes
(:func:`rough_plan`); :attr:`Plan.estimated` says so. A load plans from the header it opens
(:func:`plan_from_header`, exact).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from anyformer.plugin import AnyformerError, GGUFHeader, read_gguf_header
from anyformer_diskformer.moe_config import PER_LAYER_STATE_ARCHITECTURES, is_expert_tensor, layer_of

if TYPE_CHECKING:
    from anyformer_diskformer.gemma4_config import Gemma4Config
    from anyformer_diskformer.moe_config import MoEConfig

#: Host memory the engine takes besides its weights and caches: tokenizer, Python objects, scratch.
RAM_OVERHEAD = 64 * 10**6
#: Context a model loads with when the request names none (capped by what it was trained on).
DEFAULT_CONTEXT = 4096


#: GPU bytes besides weights, caches and slots: activations, scratch, uniforms, the rope table.
GPU_OVERHEAD = 32 * 10**6
#: Most tokens one GPU prompt step covers (:mod:`~anyformer_diskformer.gpu_prompt` says why 32).
PROMPT_STEP = 32
#: Floats between two tokens' rows of qwen35moe's delta-net step buffers are a multiple of this
#: (:mod:`~anyformer_diskformer.gpu_hybrid`): a per-token delta-rule dispatch binds its token's rows at an offset,
#: which must be a multiple of the device's storage-offset alignment (256 bytes at most in WebGPU).
ROW_ALIGN = 64


def aligned_row(floats: int) -> int:
    """``floats`` rounded up to a whole number of :data:`ROW_ALIGN` (a delta-net step buffer's row stride)."""
    return -(-floats // ROW_ALIGN) * ROW_ALIGN


#: Where the engine runs: "cpu" (numpy; dense weights as stored in host memory) or "gpu" (wgpu;
#: dense weights as stored, in GPU memory).
DEVICES = ("cpu", "gpu")


@dataclasses.dataclass(frozen=True)
class Plan:
    """The bytes a load takes on its device: dense weights (as stored; vectors as float32 on the CPU), the KV
    cache (f32 on both), the expert cache, and the smallest cache that works (one layer's top-k experts)."""

    context: int
    device: str
    dense_bytes: int
    kv_bytes: int
    expert_bytes_total: int
    one_expert_bytes: int
    experts_per_token: int
    n_layer: int
    estimated: bool
    #: GPU bytes a prompt step's activations and attention scores take beyond one token's (0 on the CPU).
    prompt_bytes: int = 0

    @property
    def min_cache_bytes(self) -> int:
        """The smallest working cache: one layer's top-k experts, as stored in the file."""
        return self.one_expert_bytes * self.experts_per_token

    @property
    def fixed_bytes(self) -> int:
        """What the device holds whatever the cache: dense weights, the KV cache and the overhead."""
        overhead = GPU_OVERHEAD + self.prompt_bytes if self.device == "gpu" else RAM_OVERHEAD
        return self.dense_bytes + self.kv_bytes + overhead

    @property
    def need(self) -> int:
        """The least budget a load takes (a refusal's ``need``)."""
        return self.fixed_bytes + self.min_cache_bytes

    def cache_bytes(self, budget: int | None) -> int:
        """The expert cache a budget leaves room for, never more than every expert."""
        if budget is None:
            return self.expert_bytes_total
        return max(0, min(self.expert_bytes_total, budget - self.fixed_bytes))


def _fact(summary: dict[str, Any], key: str) -> int:
    value = summary.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def context_for(summary: dict[str, Any], requested: int | None) -> int:
    """The context a load uses: the request's (capped by the model's own), else the default capped too."""
    trained = _fact(summary, "context_length")
    wanted = requested or DEFAULT_CONTEXT
    return min(wanted, trained) if trained else wanted


def _kv_bytes(summary: dict[str, Any], context: int) -> int:
    # Per-layer head counts (Gemma 4's) are taken at their widest: the estimate errs high.
    heads = _widest(summary, "head_count")
    kv_heads = _widest(summary, "head_count_kv") or heads
    head_dim = _fact(summary, "key_length") or (_fact(summary, "embedding_length") // heads if heads else 0)
    return 2 * _fact(summary, "block_count") * context * kv_heads * head_dim * 4


def _widest(summary: dict[str, Any], key: str) -> int:
    """A count the summary gives for the model or per layer (Gemma 4's heads): the largest."""
    value = summary.get(key)
    if isinstance(value, list):
        return max((v for v in value if isinstance(v, int) and not isinstance(v, bool) and v > 0), default=0)
    return _fact(summary, key)


def prompt_step_bytes(summary: dict[str, Any], context: int, tokens: int) -> int:
    """GPU bytes the wgpu engine's prompt steps of ``tokens`` tokens add to one token's buffers: every head's
    scores over the context, the residual, q/k/v, attention and router rows, and the experts' gathered inputs,
    [gate | up] rows and outputs (an expert's width taken as the model's, which bounds every MoE here; Gemma 4's
    dense MLP rows and the widest layer's heads counted too: an estimate, :func:`gemma4_prompt_bytes` is exact).
    0 for steps of one token."""
    tokens = min(tokens, context)  # the engine's steps never outgrow its context
    if tokens <= 1:
        return 0
    embd, heads, k = (
        _fact(summary, "embedding_length"),
        _widest(summary, "head_count"),
        _fact(summary, "expert_used_count"),
    )
    kv_heads = _widest(summary, "head_count_kv") or heads
    head_dim = _fact(summary, "key_length") or (embd // heads if heads else 0)
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    per_token = heads * context + (4 + 4 * k) * embd + 2 * q_dim + 2 * kv_dim + _fact(summary, "expert_count") + 1
    if summary.get("architecture") == "gemma4":
        # Its MLP's [gate | up] rows, and the attention output, MLP, experts' and FFN sum rows and their zeros.
        per_token += 2 * _widest(summary, "feed_forward_length") + 5 * embd
    if summary.get("architecture") == "qwen35moe":
        # Each query's output gate beside it, and the delta nets' projection, convolution and output rows, which the
        # summary does not size (Qwen3.5's are about 12 n_embd, the fixtures' 7 and 9): 16 n_embd.
        per_token += q_dim + 16 * embd
    return 4 * (tokens - 1) * per_token


def gemma4_prompt_bytes(c: Gemma4Config, context: int, tokens: int) -> int:
    """What Gemma 4's prompt steps of ``tokens`` tokens add to one token's GPU buffers, from its per-layer widths:
    the residual, attention output, MLP, experts', FFN sum and zero rows, the widest layer's q/k/v and attention
    rows and scores, and the step's router rows, experts' inputs and outputs, [gate | up] rows (the experts' or the
    widest MLP's) and combine table."""
    tokens = min(tokens, context)
    if tokens <= 1:
        return 0
    layers = range(c.n_layer)
    qkv = max(c.heads[i] * c.head_dims[i] + 2 * c.kv_heads[i] * c.head_dims[i] for i in layers)
    attn = max(c.heads[i] * c.head_dims[i] for i in layers)
    rows = 6 * c.n_embd + qkv + attn + max(c.heads) * context
    k = c.n_expert_used
    step = c.n_expert + 2 * k * c.n_embd + max(2 * k * c.n_ff_exp, 2 * max(c.ffs)) + 2 * k
    # Each of the step's five buffers takes up to 20 bytes more (GPU.buffer's margin, rounded to 16).
    return 4 * ((tokens - 1) * rows + tokens * step) + 5 * 20


def qwen35moe_prompt_bytes(c: MoEConfig, context: int, tokens: int) -> int:
    """What qwen35moe's prompt steps of ``tokens`` tokens add to one token's GPU buffers: the residual, q/k/v (each
    query followed by its gate), attention and score rows, the delta nets' projection, convolution and output rows
    (:func:`aligned_row` apart) and the position block of a step's later tokens, and the step's router rows, experts'
    inputs, [gate | up] rows (the routed and shared experts') and outputs and combine table."""
    tokens = min(tokens, context)
    if tokens <= 1:
        return 0
    keys, values = c.ssm_k_heads * c.ssm_head, c.ssm_v_heads * c.ssm_head
    channels = 2 * keys + values
    delta = aligned_row(channels + values + 2 * c.ssm_v_heads) + aligned_row(channels) + aligned_row(values)
    rows = c.n_embd + 3 * c.q_dim + 2 * c.kv_dim + c.n_head * context + delta
    k = c.n_expert_used
    m = k + (1 if c.n_ff_shexp else 0)
    step = c.n_expert + 1 + (k + m) * c.n_embd + max(2 * k * c.n_ff_exp + 2 * c.n_ff_shexp, 2 * c.n_ff) + 2 * m
    # Each of the twelve buffers takes up to 20 bytes more (GPU.buffer's margin, rounded to 16); the block is 16.
    return 4 * ((tokens - 1) * rows + tokens * step) + 12 * 20 + 32


def plan_from_header(header: GGUFHeader, context: int, device: str = "cpu", prompt_step: int = PROMPT_STEP) -> Plan:
    """The exact plan from the tensors' sizes: experts as stored, dense tensors as the device holds them.

    One expert's bytes are the largest layer's (quant mixes give some layers wider experts): every
    cache slot must take any expert.
    """
    summary = header.summary()
    dense = 0
    expert_bytes = 0
    per_layer: dict[str, int] = {}
    # Multi-token-prediction layers (bailingmoe2's nextn) are never loaded.
    nextn = header.kv.get(f"{header.architecture}.nextn_predict_layers", 0)
    run = _fact(summary, "block_count") - (nextn if isinstance(nextn, int) and nextn > 0 else 0)
    for t in header.tensors:
        if layer_of(t.name) >= run:
            continue
        if is_expert_tensor(t.name):
            expert_bytes += t.nbytes
            layer = t.name.split(".")[1]
            per_layer[layer] = per_layer.get(layer, 0) + t.nbytes
        else:
            # The CPU engine keeps vectors as float32 (as are F32 tensors) and other matrices as stored.
            dense += 4 * t.n_elements if device == "cpu" and len(t.dims) == 1 else t.nbytes
    plan = _plan(summary, context, device, dense, expert_bytes, estimated=False, prompt_step=prompt_step)
    if header.architecture in PER_LAYER_STATE_ARCHITECTURES:
        # Gemma 4's sliding layers hold a ring for the GPU's prompt steps (n_swa + step - 1 rows); the CPU engine
        # reads its ring before storing a step's keys (steps of one token here), and qwen35moe's state has no rings.
        step = prompt_step if device == "gpu" else 1
        plan = dataclasses.replace(plan, kv_bytes=_hybrid_state_bytes(header, context, step=step))
    if header.architecture == "gemma4" and device == "gpu":
        from anyformer_diskformer.gemma4_config import read_gemma4_config

        plan = dataclasses.replace(
            plan, prompt_bytes=gemma4_prompt_bytes(read_gemma4_config(header), context, prompt_step)
        )
    if header.architecture == "qwen35moe" and device == "gpu":
        from anyformer_diskformer.moe_config import read_moe_config

        plan = dataclasses.replace(
            plan, prompt_bytes=qwen35moe_prompt_bytes(read_moe_config(header), context, prompt_step)
        )
    experts = _fact(summary, "expert_count")
    widest = max(per_layer.values(), default=0) // experts if experts else 0
    # n_layer counts the layers that route (leading dense layers read no expert).
    return dataclasses.replace(
        plan, one_expert_bytes=max(plan.one_expert_bytes, widest), n_layer=len(per_layer) or plan.n_layer
    )


def _hybrid_state_bytes(header: GGUFHeader, context: int, step: int) -> int:
    """The f32 state of an architecture whose layers differ: Gemma 4's K and V per layer in that layer's widths,
    ``context`` rows for a full layer, a sliding layer's ring for steps of up to ``step`` tokens
    (:meth:`Gemma4Config.kv_rows`); qwen35moe's K and V rows for its attention layers and each delta-net layer's
    convolution inputs and state matrices."""
    from anyformer_diskformer.gemma4_config import Gemma4Config
    from anyformer_diskformer.moe_config import read_moe_config

    c = read_moe_config(header)
    if isinstance(c, Gemma4Config):
        # Gemma 4's layers differ in KV heads and head width: a K and V array each, in its own width and rows.
        return c.kv_bytes(context, step)
    kv = 2 * (c.n_layer - sum(c.recurrent)) * context * c.kv_dim * 4
    delta = sum(c.recurrent) * (
        (c.ssm_conv - 1) * (2 * c.ssm_k_heads + c.ssm_v_heads) * c.ssm_head + c.ssm_v_heads * c.ssm_head**2
    )
    return kv + 4 * delta


def plan_from_summary(
    summary: dict[str, Any], context: int, device: str = "cpu", prompt_step: int = PROMPT_STEP
) -> Plan:
    """An estimate from the header summary alone: dense parameters from the shapes, experts the rest.

    The bytes per parameter of the whole file stand in for the experts' (they are most of it).
    Untied output is assumed, so the estimate of dense bytes errs high.
    """
    embd, vocab = _fact(summary, "embedding_length"), _fact(summary, "vocab_size")
    layers, experts = _fact(summary, "block_count"), _fact(summary, "expert_count")
    heads = _fact(summary, "head_count")
    kv_heads = _fact(summary, "head_count_kv") or heads
    head_dim = _fact(summary, "key_length") or (embd // heads if heads else 0)
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    per_layer = embd * (2 * q_dim + 2 * kv_dim) + embd * experts + 2 * embd + 2 * head_dim
    dense = 2 * vocab * embd + embd + layers * per_layer
    params, data = _fact(summary, "parameter_count"), _fact(summary, "data_bytes")
    expert_params = max(0, params - dense)
    per_param = data / params if params else 0.0
    expert_bytes = int(expert_params * per_param)
    dense_bytes = int(dense * per_param)  # as stored, on both devices
    return _plan(summary, context, device, dense_bytes, expert_bytes, estimated=True, prompt_step=prompt_step)


def _plan(
    summary: dict[str, Any],
    context: int,
    device: str,
    dense_bytes: int,
    expert_bytes: int,
    *,
    estimated: bool,
    prompt_step: int = PROMPT_STEP,
) -> Plan:
    # The experts stay at their stored size on both devices.
    layers, experts = _fact(summary, "block_count"), _fact(summary, "expert_count")
    return Plan(
        context=context,
        device=device,
        dense_bytes=dense_bytes,
        kv_bytes=_kv_bytes(summary, context),
        expert_bytes_total=expert_bytes,
        one_expert_bytes=expert_bytes // (layers * experts) if layers and experts else 0,
        experts_per_token=_fact(summary, "expert_used_count"),
        n_layer=layers,
        estimated=estimated,
        prompt_bytes=prompt_step_bytes(summary, context, prompt_step) if device == "gpu" else 0,
    )


def plan_from_tensor_bytes(
    summary: dict[str, Any], context: int, device: str = "cpu", prompt_step: int = PROMPT_STEP
) -> Plan | None:
    """The plan from the summary's ``tensor_bytes`` (the core's header summary), or None when it has none.

    Experts and dense weights are as :func:`plan_from_header` counts them; the KV cache is the
    uniform one (:func:`plan_from_header` sizes Gemma 4's and qwen35moe's per layer, which this errs above).
    """
    facts = summary.get("tensor_bytes")
    if not isinstance(facts, dict) or not _fact(facts, "experts"):
        return None
    dense = _fact(facts, "dense")
    if device == "cpu":  # the CPU engine keeps vectors as float32
        dense += 4 * _fact(facts, "dense_vector_elements") - _fact(facts, "dense_vectors")
    plan = _plan(summary, context, device, dense, _fact(facts, "experts"), estimated=False, prompt_step=prompt_step)
    experts = _fact(summary, "expert_count")
    widest = _fact(facts, "experts_widest_layer") // experts if experts else 0
    return dataclasses.replace(
        plan,
        one_expert_bytes=max(plan.one_expert_bytes, widest),
        n_layer=_fact(facts, "expert_layers") or plan.n_layer,
    )


@dataclasses.dataclass(frozen=True)
class _Shape:
    """What an architecture's released models look like, for a plan without a header (a rough estimate)."""

    layers: int
    experts: int
    used: int
    #: The share of the file that is not routed experts (embeddings, attention, norms, shared experts).
    dense_share: float
    #: Key plus value width per attention layer, and the share of layers' context it spans.
    kv_width: int
    kv_share: float


#: Rough shapes from the published configs of each family's released models (Qwen3-30B-A3B,
#: Qwen3.5/3.6-35B-A3B, Gemma 4 26B-A4B, Ling 2.0/3.0 flash): dense shares from total and active
#: parameter counts; Gemma 4's sliding layers and qwen35moe's delta-net layers hold less context.
ROUGH_SHAPES: dict[str, _Shape] = {
    "qwen3moe": _Shape(layers=48, experts=128, used=8, dense_share=0.06, kv_width=512, kv_share=1.0),
    "qwen2moe": _Shape(layers=24, experts=60, used=4, dense_share=0.15, kv_width=2048, kv_share=1.0),
    "qwen35moe": _Shape(layers=40, experts=256, used=8, dense_share=0.08, kv_width=512, kv_share=0.25),
    "gemma4": _Shape(layers=30, experts=128, used=8, dense_share=0.12, kv_width=1024, kv_share=0.4),
    "bailingmoe": _Shape(layers=28, experts=64, used=6, dense_share=0.1, kv_width=2048, kv_share=1.0),
    "bailingmoe2": _Shape(layers=32, experts=256, used=8, dense_share=0.05, kv_width=512, kv_share=1.0),
}


def rough_plan(
    summary: dict[str, Any], file_bytes: int, context: int, device: str = "cpu", prompt_step: int = PROMPT_STEP
) -> Plan:
    """A plan without a header: the architecture's rough shape (:data:`ROUGH_SHAPES`) over the files' bytes.

    Dims config.json gives (layers, experts, heads) replace the shape's. :attr:`Plan.estimated` is True.
    """
    shape = ROUGH_SHAPES.get(str(summary.get("architecture")), ROUGH_SHAPES["qwen3moe"])
    layers = _fact(summary, "block_count") or shape.layers
    experts = _fact(summary, "expert_count") or shape.experts
    used = _fact(summary, "expert_used_count") or shape.used
    dense = int(file_bytes * shape.dense_share)
    expert_bytes = file_bytes - dense
    kv = _kv_bytes(summary, context) or int(2 * layers * context * shape.kv_width * 4 * shape.kv_share)
    return Plan(
        context=context,
        device=device,
        dense_bytes=dense,
        kv_bytes=kv,
        expert_bytes_total=expert_bytes,
        one_expert_bytes=expert_bytes // (layers * experts),
        experts_per_token=used,
        n_layer=layers,
        estimated=True,
        prompt_bytes=prompt_step_bytes(summary, context, prompt_step) if device == "gpu" else 0,
    )


def plan_for(
    path: str, summary: dict[str, Any], context: int, device: str = "cpu", prompt_step: int = PROMPT_STEP
) -> Plan:
    """The exact plan from the local GGUF's header, else (unreadable) the estimate from the summary."""
    try:
        return plan_from_header(read_gguf_header(path), context, device, prompt_step)
    except (AnyformerError, OSError):
        return plan_from_summary(summary, context, device, prompt_step)
