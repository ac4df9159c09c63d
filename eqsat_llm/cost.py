"""The cost of an e-node for extraction: the predicted time of its kernel.

Each e-node is priced by the roofline model (`costmodel.CostModel`) with the types of its
input and output classes (from the e-graph's shape/dtype analysis) and its attributes. A
class that the analysis proved constant is folded at compile time and is free. Literals and
containers (attribute values, tensor lists) are free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .egraph.decode import class_types, node_attrs
from .extract import ENode
from .ir import TensorType
from .ops import REGISTRY


def enode_cost_fn(serialized: dict[str, Any], view: dict[str, Any], constant: set[str],
                  model: Any) -> Callable[[ENode], float]:
    """A cost function for the extractors: seconds per e-node under `model`."""
    types = class_types(serialized)
    nodes = view["nodes"]
    memo: dict[str, float] = {}

    def input_types(raw: dict[str, Any], arity: int | None) -> list[TensorType] | None:
        if arity is None:  # the tensors of a Vec[Tensor] child
            vec = nodes[raw["children"][0]]
            children = [nodes[c]["eclass"] for c in vec["children"]]
        else:
            children = [nodes[c]["eclass"] for c in raw["children"][:arity]]
        found = [types.get(c) for c in children]
        return None if any(t is None for t in found) else found  # type: ignore[return-value]

    def cost(node: ENode) -> float:
        if node.id in memo:
            return memo[node.id]
        opdef = REGISTRY.get(node.op)
        if opdef is None or node.eclass in constant:
            value = 0.0
        else:
            raw = nodes[node.id]
            ins, out = input_types(raw, opdef.arity), types.get(node.eclass)
            if ins is None or out is None:  # a tuple-valued fallback: no static type
                value = model.unknown_seconds
            else:
                value = model.kernel(node.op, node_attrs(view, raw), ins, out).seconds
        memo[node.id] = value
        return value

    return cost


# The first cost model (a weight per op category), kept until the roofline model is wired in.
CATEGORY_COST = {"source": 0.0, "layout": 1.0, "elementwise": 2.0, "reduction": 3.0,
                 "matmul": 10.0, "attention": 20.0, "fallback": 50.0}


def op_cost(op: str) -> float:
    opdef = REGISTRY.get(op)
    if opdef is None or op == "scalar":
        return 0.0
    return CATEGORY_COST[opdef.category]
