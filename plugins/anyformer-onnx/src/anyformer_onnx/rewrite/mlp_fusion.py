"""Rewrite Phi-3's traced ``gate_up_proj`` chunk into one ``Split``.

Phi-3 computes its MLP's gate and up projections in one matmul and halves the result with
``chunk(2, dim=-1)``; the tracer spells the halving out as eight kernels a layer (``Shape``,
``Gather``, ``Add``, ``Div``, two ``Mul`` for the bounds, two ``Slice``) because the size is read
from the tensor at run time. config.json's ``intermediate_size`` is that size, so one ``Split``
into two ``intermediate_size`` halves computes the same. Per layer the ``…/mlp/`` scope must hold
exactly two ``Slice`` nodes reading the ``gate_up_proj`` output on the last axis, the first from
a constant 0 to the tensor where the second starts, and the projection must have
``2 × intermediate_size`` output columns; anything else is left as it is. The caller proves the
rewritten graph against the export.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from anyformer_onnx.rewrite.attention_fusion import live_nodes

_SCOPE = re.compile(r"layers\.(\d+)/mlp/")


def _constant(name: str, values: dict[str, np.ndarray]) -> list[int] | None:
    value = values.get(name)
    return [int(v) for v in value.reshape(-1)] if value is not None and value.size <= 4 else None


def split_gate_up(model: Any, config: Mapping[str, Any]) -> int:
    """Rewrite ``model`` (an ``onnx.ModelProto``) in place; returns how many layers' chunks became a ``Split``."""
    from onnx import helper, numpy_helper

    intermediate = config.get("intermediate_size")
    if not isinstance(intermediate, int) or isinstance(intermediate, bool) or intermediate <= 0:
        return 0
    graph = model.graph
    nodes = list(graph.node)
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer if len(t.dims) <= 1}
    for node in nodes:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    producers = {name: n for n in nodes for name in n.output if name}
    layers: dict[str, list[Any]] = {}
    for node in nodes:
        match = _SCOPE.search(node.name)
        if match and node.op_type == "Slice":
            layers.setdefault(match.group(1), []).append(node)
    default_opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    replaced: dict[int, Any] = {}
    for layer, slices in layers.items():
        if len(slices) != 2 or len({s.input[0] for s in slices}) != 1:
            continue
        source = slices[0].input[0]
        projection = producers.get(source)
        if projection is None or f"layers.{layer}/mlp/gate_up_proj/" not in projection.name:
            continue
        weight = shapes.get(projection.input[1]) if projection.op_type == "MatMul" else None
        columns = {a.name: a.i for a in projection.attribute}.get("N") if projection.op_type == "MatMulNBits" else None
        if (weight is None or weight[-1] != 2 * intermediate) and columns != 2 * intermediate:
            continue
        if any(len(s.input) not in (4, 5) or _constant(s.input[3], values) not in ([-1], [2]) for s in slices):
            continue
        if len(slices[0].input) == 5 or len(slices[1].input) == 5:
            continue  # steps: not a plain chunk
        gate = next((s for s in slices if _constant(s.input[1], values) == [0]), None)
        up = next((s for s in slices if s is not gate), None)
        if gate is None or up is None or up.input[1] != gate.input[2]:
            continue
        name = f"/anyformer/mlp/layer{layer}/chunk"
        halves = [gate.output[0], up.output[0]]
        if default_opset >= 13:
            sizes = numpy_helper.from_array(np.asarray([intermediate, intermediate], dtype=np.int64), f"{name}/sizes")
            graph.initializer.append(sizes)
            split = helper.make_node("Split", [source, sizes.name], halves, axis=-1, name=name)
        else:
            split = helper.make_node("Split", [source], halves, axis=-1, split=[intermediate] * 2, name=name)
        # At the earlier of the two slices: after the projection, before either half's readers.
        first, second = sorted((nodes.index(gate), nodes.index(up)))
        replaced[first], replaced[second] = split, None
    if not replaced:
        return 0
    kept = [replaced[i] if i in replaced else node for i, node in enumerate(nodes)]
    outputs = {o.name for o in graph.output}
    del graph.node[:]
    graph.node.extend(live_nodes([node for node in kept if node is not None], outputs))
    used = {name for n in graph.node for name in n.input}
    live = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(live)
    return sum(1 for node in replaced.values() if node is not None)
