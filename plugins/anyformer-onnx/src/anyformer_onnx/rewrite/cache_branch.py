"""Reduce optimum's older merged decoder (an ``If`` on ``use_cache_branch``) to its with-past branch.

optimum's ``decoder_model_merged.onnx`` holds two decoders in one ``If`` node: the ``then``
branch reads ``past_key_values.N.*`` and appends the new positions to them, the ``else`` branch
ignores the past and returns the prompt's keys and values. The decode loop
(:class:`anyformer_onnx.chat.decoder.DecodeLoop`) feeds ``use_cache_branch`` false only on the first
step, and on that step the past it feeds has zero positions; the with-past branch on an empty
past computes what the no-past branch computes (the same positions, nothing before them to
attend to, the presents the prompt's own). So for this loop the graph is its with-past branch,
a single graph the attention rewrite can read.

That reasoning is the loop's, not the graph's: the caller proves the reduced and fused graph
against the merged export on the probe, whose first step runs the export's no-past branch and the
reduced graph's with-past one on an empty past. The layout is checked, never guessed: one ``If``
whose condition is the ``use_cache_branch`` input and nothing else reads, whose ``then`` branch
reads every ``past_key_values`` input and whose ``else`` branch reads none, no further
subgraphs, and branch tensors that do not collide with the outer graph's names.
"""

from __future__ import annotations

from typing import Any

from anyformer_onnx.rewrite.attention_fusion import NotFusable

BRANCH_INPUT = "use_cache_branch"
_GRAPH_ATTRIBUTES = (5, 10)  # AttributeProto GRAPH, GRAPHS


def _reads(graph: Any) -> set[str]:
    return {name for node in graph.node for name in node.input if name}


def _has_subgraphs(graph: Any) -> bool:
    return any(a.type in _GRAPH_ATTRIBUTES for node in graph.node for a in node.attribute)


def reduce_to_with_past(model: Any) -> bool:
    """Replace the ``If`` on ``use_cache_branch`` in ``model`` by its with-past branch, in place.

    Returns False (model untouched) when the graph has no ``use_cache_branch`` input; raises
    :class:`NotFusable` (model untouched) when it has one in a layout this module does not reduce.
    """
    from onnx import helper

    graph = model.graph
    inputs = {i.name for i in graph.input}
    if BRANCH_INPUT not in inputs:
        return False
    branches = [n for n in graph.node if n.op_type == "If"]
    readers = [n for n in graph.node if BRANCH_INPUT in n.input]
    if len(branches) != 1 or readers != branches or list(branches[0].input) != [BRANCH_INPUT]:
        raise NotFusable("a merged decoder whose use_cache_branch is not one If's condition")
    node = branches[0]
    attributes = {a.name: a for a in node.attribute}
    if set(attributes) != {"then_branch", "else_branch"}:
        raise NotFusable("a merged decoder's If without a then and an else branch")
    with_past, without = attributes["then_branch"].g, attributes["else_branch"].g
    past = {name for name in inputs if name.startswith("past_key_values.")}
    if not past or not past <= _reads(with_past) or past & _reads(without):
        raise NotFusable("a merged decoder whose then branch is not the one reading past_key_values")
    if _has_subgraphs(with_past) or any(n is not node and _has_subgraphs_node(n) for n in graph.node):
        raise NotFusable("a merged decoder with nested subgraphs")
    if len(with_past.output) != len(node.output) or with_past.input:
        raise NotFusable("a merged decoder whose with-past branch does not return the If's outputs")
    outer = (
        inputs
        | {t.name for t in graph.initializer}
        | {name for n in graph.node for name in n.output}
        | {o.name for o in graph.output}
    )
    inner = {t.name for t in with_past.initializer} | {name for n in with_past.node for name in n.output if name}
    if inner & outer:
        raise NotFusable("a merged decoder whose branch reuses an outer tensor's name")
    # From here on the model changes: nothing below can fail on the graph's layout.
    renamed = {}
    passthrough = []
    for branch_output, name in zip(with_past.output, node.output, strict=True):
        if branch_output.name in inner:
            renamed[branch_output.name] = name
        else:  # the branch returns an outer tensor as it is
            passthrough.append(helper.make_node("Identity", [branch_output.name], [name], name=f"{name}/with_past"))
    body = []
    for inner_node in with_past.node:
        copy = type(inner_node)()
        copy.CopyFrom(inner_node)
        copy.input[:] = [renamed.get(name, name) for name in copy.input]
        copy.output[:] = [renamed.get(name, name) for name in copy.output]
        body.append(copy)
    position = list(graph.node).index(node)
    nodes = [*graph.node[:position], *body, *passthrough, *graph.node[position + 1 :]]
    graph.initializer.extend(with_past.initializer)
    graph.value_info.extend(v for v in with_past.value_info if v.name not in renamed)
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [i for i in graph.input if i.name != BRANCH_INPUT]
    del graph.input[:]
    graph.input.extend(kept)
    return True


def _has_subgraphs_node(node: Any) -> bool:
    return any(a.type in _GRAPH_ATTRIBUTES for a in node.attribute)
