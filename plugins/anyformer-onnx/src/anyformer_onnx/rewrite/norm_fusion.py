"""Rewrite a traced decoder's RMSNorms, with the residual add before each, into onnxruntime's fused operators.

A traced RMSNorm is nine nodes (casts, ``Pow``, ``ReduceMean``, ``Add`` of epsilon, ``Sqrt``,
``Div``, two ``Mul``); onnxruntime's own optimizer already folds them into one
``SimplifiedLayerNormalization`` but leaves the residual ``Add`` in front of it: 60 extra kernels a
token on SmolLM2. Here each norm scope (``…/input_layernorm/``, ``…/post_attention_layernorm/``,
``…/norm/`` in the exporter's node names) whose nodes read one tensor, write one, and scale by one
``[hidden]`` weight becomes ``com.microsoft.SkipSimplifiedLayerNormalization`` when the tensor it
reads is an ``Add`` of two computed tensors (the residual stream, which the fused operator returns
as its fourth output for whatever else reads it). A norm of anything else (the embeddings) is left
to onnxruntime's optimizer, as is a scope that does not look like that. The caller proves the
whole rewritten graph against the export.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from anyformer_onnx.rewrite.attention_fusion import live_nodes

#: The operators a traced RMSNorm is made of (anything else in the scope: not an RMSNorm).
RMS_OPS = frozenset({"Cast", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Reciprocal", "Mul", "Constant"})
_SCOPE = re.compile(r"^(.*/(?:input_layernorm|post_attention_layernorm|norm))/[^/]+$")


def _weight(graph: Any, nodes: list[Any], hidden: int, aliases: dict[str, str]) -> str | None:
    """The one ``[hidden]`` initializer the scope's nodes read (through an ``Identity`` of it too), or None."""
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    found = {aliases.get(name, name) for n in nodes for name in n.input}
    found = {name for name in found if shapes.get(name) == [hidden]}
    return found.pop() if len(found) == 1 else None


def _alias_float_casts(nodes: list[Any], inside: set[int], source: str, consumers: dict[str, set[int]]) -> None:
    """Point readers outside the scope of a ``Cast(source, to=float)`` at ``source`` itself.

    The tracer records RMSNorm's ``to(float32)`` of an fp32 tensor (a no-op that returns the same
    tensor in torch) as a Cast whose output the residual add then reads; in an fp32 graph the two
    are the same values. (In another graph a wrong alias changes dtypes, onnxruntime refuses the
    graph and the export is used.)
    """
    for index in inside:
        node = nodes[index]
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if node.op_type != "Cast" or node.input[0] != source or to != 1:
            continue
        for reader in consumers.get(node.output[0], set()) - inside:
            for position, name in enumerate(nodes[reader].input):
                if name == node.output[0]:
                    nodes[reader].input[position] = source
            consumers[node.output[0]].discard(reader)
            consumers.setdefault(source, set()).add(reader)


def fuse_norms(model: Any, config: Mapping[str, Any]) -> int:
    """Rewrite ``model`` (an ``onnx.ModelProto``) in place; returns how many norms became fused operators."""
    from onnx import helper

    hidden, epsilon = config.get("hidden_size"), config.get("rms_norm_eps")
    if not isinstance(hidden, int) or not isinstance(epsilon, (int, float)):
        return 0
    graph = model.graph
    nodes = list(graph.node)
    scopes: dict[str, list[int]] = {}
    for index, node in enumerate(nodes):
        match = _SCOPE.match(node.name)
        if match:
            scopes.setdefault(match.group(1), []).append(index)
    producers = {name: i for i, n in enumerate(nodes) for name in n.output if name}
    consumers: dict[str, set[int]] = {}
    for i, n in enumerate(nodes):
        for name in n.input:
            consumers.setdefault(name, set()).add(i)
    outputs = {o.name for o in graph.output}
    initializers = {t.name for t in graph.initializer}
    # The exporter shares equal weights (norms initialised to ones) through Identity nodes.
    aliases = {n.output[0]: n.input[0] for n in nodes if n.op_type == "Identity" and n.input[0] in initializers}
    constants = initializers | set(aliases) | {name for n in nodes if n.op_type == "Constant" for name in n.output}
    replaced: dict[int, Any] = {}  # node index → its replacement (None: removed)
    for scope, members in scopes.items():
        inside = set(members)
        kinds = {nodes[i].op_type for i in inside}
        if not kinds <= RMS_OPS or not {"ReduceMean", "Sqrt"} <= kinds or inside & replaced.keys():
            continue
        reads = {name for i in inside for name in nodes[i].input if name and name not in constants}
        reads = {name for name in reads if producers.get(name, -1) not in inside}
        if len(reads) != 1:
            continue
        _alias_float_casts(nodes, inside, next(iter(reads)), consumers)
        writes = {
            name for i in inside for name in nodes[i].output if name in outputs or consumers.get(name, set()) - inside
        }
        weight = _weight(graph, [nodes[i] for i in inside], hidden, aliases)
        if len(reads) != 1 or len(writes) != 1 or weight is None:
            continue
        source, result = reads.pop(), writes.pop()
        add = producers.get(source)
        # Only a residual add of two computed tensors is absorbed (its sum, the fused operator's
        # fourth output, stays available to whatever else reads it). A norm of anything else (the
        # embeddings) is left to onnxruntime's optimizer, which folds it into SimplifiedLayerNormalization.
        if add is None or nodes[add].op_type != "Add" or add in replaced:
            continue
        if any(name in constants for name in nodes[add].input):
            continue
        replaced[add] = helper.make_node(
            "SkipSimplifiedLayerNormalization",
            [*nodes[add].input, weight],
            [result, "", "", source],
            domain="com.microsoft",
            epsilon=float(epsilon),
            name=f"{scope}/SkipSimplifiedLayerNormalization",
        )
        for index in inside:
            replaced[index] = None
    if not replaced:
        return 0
    kept = [replaced[i] if i in replaced else node for i, node in enumerate(nodes)]
    del graph.node[:]
    graph.node.extend(live_nodes([node for node in kept if node is not None], outputs))
    used = {name for n in graph.node for name in n.input}
    live = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(live)
    return sum(1 for node in replaced.values() if node is not None)
