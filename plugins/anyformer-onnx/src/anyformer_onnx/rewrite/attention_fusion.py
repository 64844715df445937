"""Rewrite a traced Llama-style decoder's attention into onnxruntime's ``GroupQueryAttention``.

A decoder exported by tracing (``torch.onnx.export`` as optimum and transformers.js use it) spells
each layer's attention out in ~80 small nodes: reshapes and transposes of q/k/v, rotary embedding
by slices, negation and concatenation, the past concatenated with the new key and value, the key
and value heads repeated for grouped-query attention, a causal mask built from ``attention_mask``,
then two matmuls and a softmax. On the CPU each of those is a kernel launch for a tensor of a few
hundred numbers: on SmolLM2 ~2,700 of the ~2,930 kernels a token run, and about 40 % of the step.
onnxruntime's contrib operator ``com.microsoft.GroupQueryAttention`` does all of it in one kernel
(rotary from a cos/sin table, cache append, causal softmax), taking the q/k/v projections'
outputs and returning the tensor the output projection reads and the new cache.

The rewrite is structural and checked, never guessed: per layer it needs exactly one tensor out of
each of the ``q_proj``/``k_proj``/``v_proj`` name scopes (the projection, bias included) or of
one ``qkv_proj`` scope (Phi-3: q, k and v side by side, as packed GroupQueryAttention reads them),
exactly one non-constant tensor into ``o_proj``, and the layer's ``past_key_values.N.*`` and
``present.N.*``. Qwen3's per-head RMSNorm on q and k (``q_norm``/``k_norm`` scopes, reading the
projection reshaped to heads) is kept in front of the attention as one
``SimplifiedLayerNormalization`` each over the head size: GroupQueryAttention has no such norm, but
rotates what it is given, and the norm comes before the rotary in Qwen3. Anything else (a merged
decoder with ``use_cache_branch`` that :mod:`cache_branch` has not reduced, an attention that is
already fused, a q/k norm on another model_type, partial or scaled rotary this module does not
compute, a sliding window the context does not fit in) leaves the graph as it is, with the reason.
The nodes that only fed the old attention are then dropped. The caller proves the result
(:mod:`fused_graph` compares logits with the original graph) before using it.

Semantics kept: the cache layout (``[batch, kv_heads, positions, head_dim]``, past in, past plus
new out, so the decode loop is unchanged) and the inputs' names. What the fused graph assumes and
the loop guarantees: one sequence, no padding (``attention_mask`` all ones; GQA takes each row's
length from the mask's sum), positions counted from 0 (``position_ids`` is no longer read).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

#: model_type values whose attention is the Llama one: q/k/v projections (bias allowed), rotate-half
#: rotary on the full head, causal softmax scaled by 1/sqrt(head_dim), grouped-query heads.
LLAMA_LIKE = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3"})
#: model_type values whose q and k heads are RMS-normed (over the head size) before the rotary.
QK_NORMED = frozenset({"qwen3"})
#: model_type values whose attention is windowed whenever config.json sets ``sliding_window``
#: (the others only with ``use_sliding_window`` true).
ALWAYS_WINDOWED = frozenset({"mistral", "phi3"})
#: Rotary variants whose cos/sin table this module computes (transformers' rope_type names).
ROPE_TYPES = frozenset({"default", "linear", "llama3"})
#: The most positions a cos/sin table is built for (2 × positions × head_dim/2 floats).
MAX_TABLE_POSITIONS = 131072
#: Bounds on config.json's shapes (a hostile config.json must not size a huge table).
MAX_HEAD_DIM, MAX_HEADS = 1024, 1024
MS_DOMAIN = "com.microsoft"
_ELEMENT = {1: np.float32, 10: np.float16}  # TensorProto FLOAT, FLOAT16


class NotFusable(Exception):
    """The graph does not have the shape this rewrite needs; the message says what is missing."""


@dataclasses.dataclass(frozen=True)
class AttentionShape:
    """What GroupQueryAttention needs from config.json: heads, head size and the rotary table."""

    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    positions: int
    inv_freq: np.ndarray  # [head_dim / 2], float32
    qk_norm_epsilon: float | None = None  # Qwen3's q/k RMSNorm epsilon; None: no q/k norm


def _positive(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _rope(config: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
    """(theta, scaling) in transformers 5's ``rope_parameters`` or 4's ``rope_theta``/``rope_scaling``."""
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict):
        theta = parameters.get("rope_theta", config.get("rope_theta", 10000.0))
        return float(theta), dict(parameters)
    scaling = config.get("rope_scaling")
    scaling = dict(scaling) if isinstance(scaling, dict) else {}
    return float(config.get("rope_theta", 10000.0)), scaling


def inverse_frequencies(config: Mapping[str, Any], head_dim: int) -> np.ndarray:
    """The rotary inverse frequencies transformers computes for this config (default, linear, llama3)."""
    try:
        theta, scaling = _rope(config)
    except (TypeError, ValueError) as exc:
        raise NotFusable(f"rope_theta unreadable: {exc}") from exc
    kind = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if kind not in ROPE_TYPES:
        raise NotFusable(f"rotary type {kind!r}")
    # transformers 5 keeps the factor inside rope_parameters (Phi-3), 4 at the top level.
    if config.get("partial_rotary_factor", scaling.get("partial_rotary_factor", 1.0)) not in (1, 1.0, None):
        raise NotFusable("partial rotary")
    try:
        return _frequencies(kind, theta, scaling, head_dim)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, FloatingPointError) as exc:
        raise NotFusable(f"rotary parameters of {kind!r} unreadable: {type(exc).__name__} {exc}") from exc


def _frequencies(kind: str, theta: float, scaling: dict[str, Any], head_dim: int) -> np.ndarray:
    if not theta > 0:
        raise ValueError(f"rope_theta {theta}")
    with np.errstate(all="raise"):
        exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim
        inv = (1.0 / (theta**exponents)).astype(np.float32)
        if kind == "linear":
            factor = float(scaling["factor"])
            if not factor > 0:
                raise ValueError(f"factor {factor}")
            return (inv / factor).astype(np.float32)
        if kind == "llama3":
            # Frequencies with wavelengths longer than the original context are divided by the factor,
            # short ones kept, the band between blended linearly in the inverse wavelength.
            factor = float(scaling["factor"])
            low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
            original = float(scaling["original_max_position_embeddings"])
            if not (factor > 0 and 0 < low < high and original > 0):
                raise ValueError(f"factor {factor}, low {low}, high {high}, original {original}")
            wavelength = 2 * math.pi / inv
            scaled = np.where(wavelength > original / low, inv / factor, inv)
            blend = (original / wavelength - low) / (high - low)
            blended = (1 - blend) * scaled / factor + blend * scaled
            medium = (wavelength >= original / high) & (wavelength <= original / low)
            return np.where(medium, blended, scaled).astype(np.float32)
    return inv


def attention_shape(config: Mapping[str, Any], context: int | None = None) -> AttentionShape:
    """Read the attention's shape from config.json; :class:`NotFusable` when it is not a plain Llama one.

    A sliding window is refused unless ``context`` (the most positions the loop will hold) fits in
    it: then no position is ever outside any query's window, and windowed attention is full attention.
    """
    kind = config.get("model_type")
    if kind not in LLAMA_LIKE:
        raise NotFusable(f"model_type {kind!r} is not one of {sorted(LLAMA_LIKE)}")
    window = config.get("sliding_window")
    if window and config.get("use_sliding_window", kind in ALWAYS_WINDOWED):
        # transformers masks key j for query i when i - j >= window: with at most `context`
        # positions, i - j <= context - 1 < window.
        if not (isinstance(window, int) and context is not None and 0 < context <= window):
            raise NotFusable(f"sliding-window attention (window {window}, context {context})")
    layer_types = config.get("layer_types")
    if layer_types is not None and (
        not isinstance(layer_types, list) or any(t != "full_attention" for t in layer_types)
    ):
        raise NotFusable("layers other than full attention in layer_types")
    epsilon = config.get("rms_norm_eps")
    if kind in QK_NORMED and not (
        isinstance(epsilon, (int, float)) and not isinstance(epsilon, bool) and 0 < epsilon < 1
    ):
        raise NotFusable("no rms_norm_eps for the q/k norms")
    heads, layers = _positive(config, "num_attention_heads"), _positive(config, "num_hidden_layers")
    hidden = _positive(config, "hidden_size")
    kv_heads = _positive(config, "num_key_value_heads") or heads
    head_dim = _positive(config, "head_dim") or (hidden // heads if hidden and heads else None)
    positions = _positive(config, "max_position_embeddings")
    if not (heads and layers and kv_heads and head_dim and positions) or heads % kv_heads or head_dim % 2:
        raise NotFusable("config.json lacks consistent head counts, head size or max_position_embeddings")
    if head_dim > MAX_HEAD_DIM or heads > MAX_HEADS:  # the rotary table is positions × head_dim / 2
        raise NotFusable(f"{heads} heads of {head_dim}: beyond what this rewrite builds tables for")
    return AttentionShape(
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        layers=layers,
        positions=min(positions, MAX_TABLE_POSITIONS),
        inv_freq=inverse_frequencies(config, head_dim),
        qk_norm_epsilon=float(epsilon) if kind in QK_NORMED and isinstance(epsilon, (int, float)) else None,
    )


def rotary_tables(shape: AttentionShape, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [positions, head_dim / 2], as transformers computes them (fp32 product, then cos/sin)."""
    angles = np.arange(shape.positions, dtype=np.float32)[:, None] * shape.inv_freq[None, :]
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def _scope_outputs(nodes: list[Any], inside: set[int], consumers: dict[str, list[int]], outputs: set[str]) -> list[str]:
    """Tensors made by the nodes ``inside`` that a node outside (or the graph's outputs) reads."""
    found = []
    for index in sorted(inside):
        for name in nodes[index].output:
            if name and (name in outputs or any(c not in inside for c in consumers.get(name, []))):
                found.append(name)
    return found


def _scope_inputs(nodes: list[Any], inside: set[int], producers: dict[str, int], constants: set[str]) -> list[str]:
    """Non-constant tensors the nodes ``inside`` read from outside."""
    found: list[str] = []
    for index in sorted(inside):
        for name in nodes[index].input:
            if name and name not in constants and producers.get(name, -1) not in inside and name not in found:
                found.append(name)
    return found


@dataclasses.dataclass(frozen=True)
class FusionReport:
    """What the rewrite did: layers fused and nodes before and after."""

    layers: int
    nodes_before: int
    nodes_after: int
    packed_qkv: int = 0


def fuse_attention(model: Any, config: Mapping[str, Any], context: int | None = None) -> FusionReport:
    """Rewrite ``model`` (an ``onnx.ModelProto``) in place; :class:`NotFusable` (model untouched) when it cannot.

    ``context``: the most positions the decode loop will hold (see :func:`attention_shape`).
    """
    from onnx import TensorProto, helper, numpy_helper

    shape = attention_shape(config, context)
    graph = model.graph
    nodes = list(graph.node)
    inputs = {i.name: i for i in graph.input}
    outputs = {o.name for o in graph.output}
    if "use_cache_branch" in inputs or any(a.type in (5, 10) for n in nodes for a in n.attribute):  # GRAPH(S)
        raise NotFusable("a merged decoder with subgraphs")
    if any(n.op_type in ("GroupQueryAttention", "MultiHeadAttention", "Attention") for n in nodes):
        raise NotFusable("the attention is already fused")
    if "attention_mask" not in inputs:
        raise NotFusable("no attention_mask input")
    first_past = inputs.get("past_key_values.0.key")
    element = first_past.type.tensor_type.elem_type if first_past is not None else 0
    if element not in _ELEMENT:
        raise NotFusable("no float or float16 past_key_values.0.key")
    producers = {name: i for i, n in enumerate(nodes) for name in n.output if name}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for name in n.input:
            consumers.setdefault(name, []).append(i)
    constants = {t.name for t in graph.initializer} | {
        name for n in nodes if n.op_type == "Constant" for name in n.output
    }
    initializers_by_name = {t.name: t for t in graph.initializer}
    # The exporter shares equal weights (norms initialised alike) through Identity nodes.
    aliases = {n.output[0]: n.input[0] for n in nodes if n.op_type == "Identity" and n.input[0] in initializers_by_name}
    constants |= set(aliases)

    plans = []
    for layer in range(shape.layers):
        scopes: dict[str, set[int]] = {}
        for part in ("q", "k", "v", "o", "qkv"):
            marker = re.compile(rf"layers\.{layer}/self_attn/{part}_proj/")
            scopes[part] = {i for i, n in enumerate(nodes) if marker.search(n.name)}
        # Phi-3 exports one qkv_proj whose output is q, k and v side by side, in the order packed
        # GroupQueryAttention reads; the others one projection each.
        parts = ("qkv",) if scopes["qkv"] and not (scopes["q"] or scopes["k"] or scopes["v"]) else ("q", "k", "v")
        for part in (*parts, "o"):
            if not scopes[part]:
                raise NotFusable(f"layer {layer}: no {part}_proj nodes")
        projected = {}
        for part in parts:
            out = _scope_outputs(nodes, scopes[part], consumers, outputs)
            if len(out) != 1:
                raise NotFusable(f"layer {layer}: {part}_proj has {len(out)} outputs")
            projected[part] = out[0]
        into_o = _scope_inputs(nodes, scopes["o"], producers, constants)
        readers = scopes["o"]
        quantizer = {producers.get(name, -1) for name in into_o}
        if len(into_o) > 1 and len(quantizer) == 1 and nodes[min(quantizer)].op_type == "DynamicQuantizeLinear":
            # An int8 graph (quantize_dynamic) quantizes the attention's output just before o_proj:
            # that node is what reads the attention.
            readers = quantizer
            into_o = [nodes[min(quantizer)].input[0]]
        if len(into_o) != 1:
            raise NotFusable(f"layer {layer}: o_proj reads {len(into_o)} tensors")
        norms = _qk_norms(nodes, layer, shape, projected, producers, constants, initializers_by_name, aliases)
        past = (f"past_key_values.{layer}.key", f"past_key_values.{layer}.value")
        present = (f"present.{layer}.key", f"present.{layer}.value")
        if not all(name in inputs for name in past) or not all(name in outputs for name in present):
            raise NotFusable(f"layer {layer}: no past_key_values/present pair")
        plans.append((layer, projected, into_o[0], readers, past, present, [scopes[p] for p in parts], norms))
    if any(
        re.search(rf"layers\.{shape.layers}/", n.name) for n in nodes
    ):  # config.json and the graph disagree on depth
        raise NotFusable("the graph has more layers than config.json says")

    before = len(nodes)
    cos, sin = rotary_tables(shape, _ELEMENT[element])
    prefix = "/anyformer/gqa"
    seqlens, total = f"{prefix}/seqlens_k", f"{prefix}/total_sequence_length"
    default_opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    new_nodes = []
    if default_opset >= 13:
        graph.initializer.append(numpy_helper.from_array(np.asarray([1], dtype=np.int64), f"{prefix}/axis1"))
        new_nodes.append(
            helper.make_node(
                "ReduceSum",
                ["attention_mask", f"{prefix}/axis1"],
                [f"{prefix}/lengths"],
                keepdims=0,
                name=f"{prefix}/sum",
            )
        )
    else:
        new_nodes.append(
            helper.make_node(
                "ReduceSum", ["attention_mask"], [f"{prefix}/lengths"], axes=[1], keepdims=0, name=f"{prefix}/sum"
            )
        )
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.asarray(1, dtype=np.int64), f"{prefix}/one"),
            numpy_helper.from_array(cos, f"{prefix}/cos_cache"),
            numpy_helper.from_array(sin, f"{prefix}/sin_cache"),
        ]
    )
    new_nodes += [
        helper.make_node("Sub", [f"{prefix}/lengths", f"{prefix}/one"], [f"{prefix}/last"], name=f"{prefix}/sub"),
        helper.make_node("Cast", [f"{prefix}/last"], [seqlens], to=TensorProto.INT32, name=f"{prefix}/seqlens"),
        helper.make_node("Shape", ["attention_mask"], [f"{prefix}/mask_shape"], name=f"{prefix}/shape"),
        helper.make_node(
            "Gather", [f"{prefix}/mask_shape", f"{prefix}/one"], [f"{prefix}/total64"], axis=0, name=f"{prefix}/gather"
        ),
        helper.make_node("Cast", [f"{prefix}/total64"], [total], to=TensorProto.INT32, name=f"{prefix}/total"),
    ]
    # The old attention's present tensors keep being made under another name until the sweep below
    # drops them; the graph outputs come from GroupQueryAttention.
    renamed = {name: f"{name}/unfused" for plan in plans for name in plan[5]}
    initializers = {t.name: t for t in graph.initializer}
    for node in nodes:
        for position, name in enumerate(node.input):
            if name in renamed:
                node.input[position] = renamed[name]
        for position, name in enumerate(node.output):
            if name in renamed:
                node.output[position] = renamed[name]
    packed_layers = 0
    if any(plan[7] for plan in plans):
        graph.initializer.extend(
            [
                numpy_helper.from_array(np.asarray([0, 0, -1, shape.head_dim], dtype=np.int64), f"{prefix}/heads"),
                numpy_helper.from_array(np.asarray([0, 0, -1], dtype=np.int64), f"{prefix}/rows"),
            ]
        )
    for layer, projected, attended, o_scope, past, present, qkv_scopes, norms in plans:
        fused = f"{prefix}/layer{layer}/output"
        if "qkv" in projected:  # packed by the export: nothing to pack or norm
            qkv = [projected["qkv"], "", ""]
            packed_layers += 1
        else:
            qkv = [projected["q"], projected["k"], projected["v"]]
        singles = [nodes[min(scope)] for scope in qkv_scopes if len(scope) == 1]
        packed = (
            None
            if norms or "qkv" in projected
            else _pack_projections(singles, initializers, f"{prefix}/layer{layer}/qkv_proj")
        )
        for position, part in enumerate("qk"):
            if norms:
                # [batch, sequence, heads × head_dim] → heads → RMSNorm over head_dim → back: what
                # GroupQueryAttention reads, normed and not yet rotated (it rotates q and k itself).
                name = f"{prefix}/layer{layer}/{part}_norm"
                new_nodes += [
                    helper.make_node(
                        "Reshape", [qkv[position], f"{prefix}/heads"], [f"{name}/heads"], name=f"{name}/split"
                    ),
                    helper.make_node(
                        "SimplifiedLayerNormalization",
                        [f"{name}/heads", norms[part]],
                        [f"{name}/normed"],
                        axis=-1,
                        epsilon=shape.qk_norm_epsilon,
                        stash_type=1,
                        name=name,
                    ),
                    helper.make_node(
                        "Reshape", [f"{name}/normed", f"{prefix}/rows"], [f"{name}/output"], name=f"{name}/join"
                    ),
                ]
                qkv[position] = f"{name}/output"
        if packed is not None:
            # One matmul for q, k and v (GroupQueryAttention splits the packed rows itself).
            node, weights = packed
            graph.initializer.extend(weights)
            new_nodes.append(node)
            qkv = [node.output[0], "", ""]
            packed_layers += 1
        new_nodes.append(
            helper.make_node(
                "GroupQueryAttention",
                [*qkv, *past, seqlens, total, f"{prefix}/cos_cache", f"{prefix}/sin_cache"],
                [fused, *present],
                domain=MS_DOMAIN,
                name=f"{prefix}/layer{layer}",
                num_heads=shape.heads,
                kv_num_heads=shape.kv_heads,
                scale=1.0 / math.sqrt(shape.head_dim),
                do_rotary=1,
                rotary_interleaved=0,
            )
        )
        for index in o_scope:
            node = nodes[index]
            for position, name in enumerate(node.input):
                if name == attended:
                    node.input[position] = fused
    # Each GroupQueryAttention goes right after the last producer of its inputs: the node list
    # stays topologically sorted, as ONNX requires.
    ordered = _insert_sorted(nodes, new_nodes)
    kept = live_nodes(ordered, outputs)
    del graph.node[:]
    graph.node.extend(kept)
    used = {name for n in kept for name in n.input}
    live_initializers = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(live_initializers)
    live_inputs = [i for i in graph.input if i.name in used]
    del graph.input[:]
    graph.input.extend(live_inputs)
    made = {name for n in kept for name in n.output}
    live_info = [v for v in graph.value_info if v.name in made]
    del graph.value_info[:]
    graph.value_info.extend(live_info)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return FusionReport(layers=len(plans), nodes_before=before, nodes_after=len(kept), packed_qkv=packed_layers)


def _qk_norms(
    nodes: list[Any],
    layer: int,
    shape: AttentionShape,
    projected: dict[str, str],
    producers: dict[str, int],
    constants: set[str],
    initializers: dict[str, Any],
    aliases: dict[str, str],
) -> dict[str, str]:
    """The q and k norms' ``[head_dim]`` weights (by initializer name) when the model has them, else {}.

    Each norm scope must read one computed tensor, a ``Reshape`` of its projection's output (the
    heads split out), and one ``[head_dim]`` weight. A q/k norm on a model_type without one in
    :data:`QK_NORMED` (or the other way round) is refused: it is not what this rewrite computes.
    """
    found: dict[str, str] = {}
    for part in ("q", "k"):
        marker = re.compile(rf"layers\.{layer}/self_attn/{part}_norm/")
        inside = {i for i, n in enumerate(nodes) if marker.search(n.name)}
        if not inside:
            continue
        if shape.qk_norm_epsilon is None:
            raise NotFusable(f"layer {layer}: a {part} norm, which this model_type does not have")
        reads = {
            name
            for i in inside
            for name in nodes[i].input
            if name and name not in constants and producers.get(name, -1) not in inside
        }
        source = producers.get(next(iter(reads)), -1) if len(reads) == 1 else -1
        if source < 0 or nodes[source].op_type != "Reshape" or nodes[source].input[0] != projected[part]:
            raise NotFusable(f"layer {layer}: the {part} norm does not read its projection's heads")
        weights = {aliases.get(name, name) for i in inside for name in nodes[i].input}
        weights = {
            name for name in weights if name in initializers and list(initializers[name].dims) == [shape.head_dim]
        }
        if len(weights) != 1:
            raise NotFusable(f"layer {layer}: the {part} norm has {len(weights)} [head_dim] weights")
        found[part] = weights.pop()
    if shape.qk_norm_epsilon is not None and len(found) != 2:
        raise NotFusable(f"layer {layer}: no q_norm and k_norm nodes")
    return found


def _pack_projections(projections: list[Any], initializers: dict[str, Any], name: str) -> tuple[Any, list[Any]] | None:
    """One node computing q, k and v side by side, when each is a single bias-free matmul of one input.

    ``MatMulNBits`` (same K, block size, bits and accuracy level) concatenates its packed weights,
    scales and zero points row by row (each output row is stored on its own); a plain ``MatMul``
    concatenates its ``[K, N]`` weights along N. Anything else: None (the three stay apart).
    """
    from onnx import helper, numpy_helper

    if len(projections) != 3 or len({n.op_type for n in projections}) != 1:
        return None
    if len({n.input[0] for n in projections}) != 1:
        return None
    first = projections[0]
    if first.op_type == "MatMul":
        weights: list[Any] = [initializers.get(n.input[1]) for n in projections]
        if any(w is None or len(w.dims) != 2 for w in weights):
            return None
        weight = numpy_helper.from_array(
            np.concatenate([numpy_helper.to_array(w) for w in weights], axis=1), f"{name}/weight"
        )
        return helper.make_node("MatMul", [first.input[0], weight.name], [f"{name}/output"], name=name), [weight]
    if first.op_type != "MatMulNBits":
        return None
    attributes = [{a.name: helper.get_attribute_value(a) for a in n.attribute} for n in projections]
    if any(
        any(a.get(key) != attributes[0].get(key) for key in ("K", "bits", "block_size", "accuracy_level"))
        for a in attributes
    ):
        return None
    arity = {len([i for i in n.input if i]) for n in projections}
    if arity not in ({3}, {4}) or any(len(n.input) > 4 for n in projections):
        return None  # g_idx or bias: not packed
    rows = [int(a["N"]) for a in attributes]
    parts: list[Any] = []
    for position in range(1, arity.pop()):  # B, scales and the zero points when there are any
        tensors: list[Any] = [initializers.get(n.input[position]) for n in projections]
        if any(t is None for t in tensors):
            return None
        arrays = [numpy_helper.to_array(t) for t in tensors]
        if any(array.size % count for array, count in zip(arrays, rows, strict=True)):
            return None
        joined = np.concatenate([array.reshape(count, -1) for array, count in zip(arrays, rows, strict=True)])
        shape = (sum(rows), *arrays[0].shape[1:]) if arrays[0].ndim > 1 else (joined.size,)
        parts.append(numpy_helper.from_array(joined.reshape(shape), f"{name}/input{position}"))
    merged = dict(attributes[0], N=sum(rows))
    node = helper.make_node(
        "MatMulNBits",
        [first.input[0], *(p.name for p in parts)],
        [f"{name}/output"],
        name=name,
        domain=first.domain,
        **merged,
    )
    return node, parts


def _insert_sorted(nodes: list[Any], new_nodes: list[Any]) -> list[Any]:
    """``nodes`` with each of ``new_nodes`` placed after the producers of everything it reads."""
    ordered = list(nodes)
    for node in new_nodes:
        position = {name: i for i, n in enumerate(ordered) for name in n.output if name}
        after = max((position[name] for name in node.input if name in position), default=-1)
        ordered.insert(after + 1, node)
    return ordered


def live_nodes(nodes: list[Any], outputs: set[str]) -> list[Any]:
    """The nodes the graph's outputs depend on, in their order (the old attention's nodes fall away)."""
    needed = set(outputs)
    kept = []
    for node in reversed(nodes):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
    return kept[::-1]
