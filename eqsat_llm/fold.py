"""Constant folding: a pass from graph to graph.

Every value computed only from weights, constants and generated tensors (rotary cos/sin tables,
masks, transposed or concatenated weights) is evaluated once, at compile time, with the ops'
reference semantics and becomes a prepared constant (`const` node, tensor in
`graph.constants`). The e-graph knows which classes are constant (`is_const` in analysis.py)
and the cost model counts them as free, so extraction prefers programs that fold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .ir import VALUE_LEAVES, Graph, Node, TensorType, dtype_of
from .ops import evaluate
from .ops.registry import REGISTRY
from .weights.interning import intern
from .weights.lazy_weights import WeightRef, with_recipe

KEEP = VALUE_LEAVES | {"fallback"}  # fallbacks may not be pure: never folded


@dataclass
class Folded:
    graph: Graph
    count: int  # nodes evaluated at compile time
    nbytes: int  # bytes of the prepared constants they became
    remap: dict[int, int] = field(default_factory=dict)  # node id before -> after, where kept


def const_classes(serialized: dict[str, Any]) -> set[str]:
    """E-classes that the analysis proved constant, read from the serialized e-graph."""
    nodes = serialized["nodes"]
    return {nodes[n["children"][0]]["eclass"] for n in nodes.values() if n["op"] == "is_const"}


def fold_constants(graph: Graph) -> Folded:
    out = Graph(constants=dict(graph.constants))
    remap: dict[int, int] = {}
    values: dict[int, Any] = {}  # new id -> compile-time value, for constant nodes
    names: dict[int, WeightRef] = {}  # new id -> the meta weight a param node reads
    count = nbytes = 0
    live = graph.live_ids()
    kept_views = views_read_in_place(graph, live)
    with torch.no_grad():
        for node in graph.nodes:
            if node.id not in live:
                continue
            inputs = tuple(remap[i] for i in node.inputs)
            if node.op not in KEEP and node.id not in kept_views and \
                    all(i in values for i in inputs):
                value = _fold_value(node, [names.get(i, values[i]) for i in inputs])
                if isinstance(value, torch.Tensor):
                    name = f"folded.{node.id}"
                    value = intern(value.contiguous())  # one copy across programs
                    out.constants[name] = value
                    new = out.append("const", (), {"name": name}, node.type)
                    values[new] = value
                    remap[node.id] = new
                    count += 1
                    nbytes += value.numel() * value.element_size()
                    continue
            new = out.append(node.op, inputs, node.attrs, node.type)
            remap[node.id] = new
            if node.op in ("param", "const"):
                values[new] = graph.constants[node.attrs["name"]]
                if values[new].is_meta:  # a recipe names the weights it is made from
                    names[new] = WeightRef(node.attrs["name"], values[new])
            elif node.op == "scalar":
                values[new] = evaluate("scalar", [], node.attrs)
    out.outputs = [remap[i] for i in graph.outputs]
    pruned, kept = pruned_with_map(out)
    return Folded(pruned, count, nbytes, {old: kept[new] for old, new in remap.items()
                                          if new in kept})


def views_read_in_place(graph: Graph, live: set[int]) -> set[int]:
    """The layout views of a stored weight (param or const) that only operands packing any
    strides read (OpDef.packs_strided: an expert GEMM's weight): left views, so the kernel
    prepares its form from the weight as stored and no transposed copy is held beside it."""
    readers: dict[int, list[tuple[str, int]]] = {}
    for node in graph.nodes:
        if node.id in live:
            for pos, i in enumerate(node.inputs):
                readers.setdefault(i, []).append((node.op, pos))

    def packs(op: str, pos: int) -> bool:
        d = REGISTRY.get(op)
        return d is not None and pos < len(d.operands) and d.operands[pos] in d.packs_strided

    return {n.id for n in graph.nodes if n.id in live and n.op in ("permute", "transpose")
            and graph.node(n.inputs[0]).op in ("param", "const") and n.id not in graph.outputs
            and readers.get(n.id) and all(packs(op, pos) for op, pos in readers[n.id])}


def _fold_value(node: Node, args: list[Any]) -> Any:
    """The compile-time value of `node`. A value computed from a meta tensor (a model built on
    the meta device: shapes without storage) is a meta tensor of the node's type, never
    evaluated: it plans like the real prepared constant (a merged or quantized weight of its
    true size), holds no bytes, and carries the recipe that makes it from the loaded weights.
    None (not folded) where the node's value is a tuple."""
    if not any(isinstance(a, WeightRef) or isinstance(a, torch.Tensor) and a.is_meta
               for a in args):
        return evaluate(node.op, args, node.attrs)
    if not isinstance(node.type, TensorType):
        return None
    # the recipe makes the real value once the weights are loaded (weights/lazy_weights.py)
    return with_recipe(torch.empty(node.type.shape, dtype=dtype_of(node.type.dtype),
                                   device="meta"), node.op, node.attrs, args)


def prune(graph: Graph) -> Graph:
    """The live part of a graph (folding leaves the intermediate constants dead), with only
    the constants it still reads."""
    return pruned_with_map(graph)[0]


def pruned_with_map(graph: Graph) -> tuple[Graph, dict[int, int]]:
    """`prune`, and the new id of every node kept."""
    live = graph.live_ids()
    out = Graph()
    remap: dict[int, int] = {}
    for node in graph.nodes:
        if node.id in live:
            remap[node.id] = out.append(node.op, tuple(remap[i] for i in node.inputs),
                                        node.attrs, node.type)
    out.outputs = [remap[i] for i in graph.outputs]
    used = {n.attrs["name"] for n in out.nodes if n.op in ("param", "const")}
    out.constants = {k: v for k, v in graph.constants.items() if k in used}
    return out, remap
