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
from typing import Any

from anyformer.plugin import AnyformerError, GGUFHeader
from anyformer_diskformer.arch.moe_config import is_expert_tensor, layer_of
from anyformer_diskformer.arch.registry import ARCHITECTURES, FALLBACK, find_spec, read_moe_config
from anyformer_diskformer.arch.summary_facts import fact as _fact
from anyformer_diskformer.arch.summary_facts import widest as _widest
from anyformer_diskformer.engines.gpu.layout import PROMPT_STEP

#: Host memory the engine takes besides its weights and caches: tokenizer, Python objects, scratch.
RAM_OVERHEAD = 64 * 10**6
#: Context a model loads with when the request names none (capped by what it was trained on).
DEFAULT_CONTEXT = 4096


#: GPU bytes besides weights, caches and slots: activations, scratch, uniforms, the rope table.
GPU_OVERHEAD = 32 * 10**6
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


def prompt_step_bytes(summary: dict[str, Any], context: int, tokens: int) -> int:
    """GPU bytes the wgpu engine's prompt steps of ``tokens`` tokens add to one token's buffers: every head's
    scores over the context, the residual, q/k/v, attention and router rows, and the experts' gathered inputs,
    [gate | up] rows and outputs (an expert's width taken as the model's, which bounds every MoE here; Gemma 4's
    dense MLP rows and the widest layer's heads counted too: an estimate, its spec's ``prompt_bytes`` is exact, and its
    spec's ``prompt_row_floats`` adds its own layers' rows). 0 for steps of one token."""
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
    spec = find_spec(summary.get("architecture"))
    if spec is not None and spec.prompt_row_floats is not None:
        per_token += spec.prompt_row_floats(summary, embd, q_dim)  # its own layers' rows (Gemma 4's MLP, delta nets)
    return 4 * (tokens - 1) * per_token


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
    spec = find_spec(header.architecture)
    if spec is not None and spec.state_bytes is not None:
        # Gemma 4's sliding layers hold a ring for the GPU's prompt steps (n_swa + step - 1 rows); the CPU engine
        # reads its ring before storing a step's keys (steps of one token here), and qwen35moe's state has no rings.
        step = prompt_step if device == "gpu" else 1
        plan = dataclasses.replace(plan, kv_bytes=spec.state_bytes(read_moe_config(header), context, step))
    if spec is not None and spec.prompt_bytes is not None and device == "gpu":
        plan = dataclasses.replace(plan, prompt_bytes=spec.prompt_bytes(read_moe_config(header), context, prompt_step))
    experts = _fact(summary, "expert_count")
    widest = max(per_layer.values(), default=0) // experts if experts else 0
    # n_layer counts the layers that route (leading dense layers read no expert).
    return dataclasses.replace(
        plan, one_expert_bytes=max(plan.one_expert_bytes, widest), n_layer=len(per_layer) or plan.n_layer
    )


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
    # A Hub split set's summary is its first shard's, scaled to the set's bytes: an estimate.
    estimated = summary.get("set_estimated") is True
    plan = _plan(summary, context, device, dense, _fact(facts, "experts"), estimated=estimated, prompt_step=prompt_step)
    experts = _fact(summary, "expert_count")
    widest = _fact(facts, "experts_widest_layer") // experts if experts else 0
    return dataclasses.replace(
        plan,
        one_expert_bytes=max(plan.one_expert_bytes, widest),
        n_layer=_fact(facts, "expert_layers") or plan.n_layer,
    )


def rough_plan(
    summary: dict[str, Any], file_bytes: int, context: int, device: str = "cpu", prompt_step: int = PROMPT_STEP
) -> Plan:
    """A plan without a header: the architecture's rough shape (its spec's ``rough_shape``) over the files' bytes.

    Dims config.json gives (layers, experts, heads) replace the shape's. :attr:`Plan.estimated` is True.
    """
    shape = (find_spec(summary.get("architecture")) or ARCHITECTURES[FALLBACK]).rough_shape
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
    """The exact plan from the local GGUF's header (a split set's first shard: every shard's tensors), else
    (unreadable) the estimate from the summary."""
    from anyformer_gguf_gpu.gguf_file import read_model_header

    try:
        return plan_from_header(read_model_header(path), context, device, prompt_step)
    except (AnyformerError, OSError):
        return plan_from_summary(summary, context, device, prompt_step)
