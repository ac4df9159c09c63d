"""The cost of an e-node for extraction, and of a program: predicted kernel time in
microseconds (extraction's tolerances are absolute, so seconds would make costs look equal).

Each e-node is priced by the roofline model (`costmodel.CostModel`) with the types of its
input and output classes (from the e-graph's shape/dtype analysis) and its attributes. A
class that the analysis proved constant is folded at compile time and is free. Literals and
containers (attribute values, tensor lists) are free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..egraph.analysis import CONST_SOURCES, NEVER_CONST
from ..egraph.decode import class_types, node_attrs
from ..ir import VALUE_LEAVES, TensorType
from ..ops import REGISTRY
from .egraph_json import ENode


def enode_cost_fn(serialized: dict[str, Any], view: dict[str, Any], constant: set[str],
                  model: Any) -> Callable[[ENode], float]:
    """A cost function for the extractors: the predicted microseconds of an e-node under
    `model` (`model.micros`), 0 for constant classes and for literals and containers."""
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
            ins = input_types(raw, opdef.arity)
            out = types.get(node.eclass)
            # an input's type is unknown (a tuple, or not derived), or the node's own (a rule
            # built it from operands whose promotion the analysis leaves unknown, such as
            # int32 x a Python int): pessimistic
            if ins is None or out is None and opdef.cost not in UNTYPED_OK:
                value = UNKNOWN_MICROS
                cost.unpriced.append(node.op)  # type: ignore[attr-defined]
            else:
                # a tuple-valued fallback's class has no single tensor type: ()
                value = model.micros(node.op, node_attrs(view, raw), ins, out or ())
        memo[node.id] = value
        return value

    cost.unpriced = []  # type: ignore[attr-defined]  # ops of e-nodes priced as unknown
    return cost


# The microseconds charged for an e-node whose input types the e-graph cannot give
# (tuple-valued fallbacks): pessimistic, so that extraction never prefers a program because
# it knows less about it.
UNKNOWN_MICROS = 1000.0
# cost kinds priced without their output's type (a fallback's may be a tuple)
UNTYPED_OK = ("leaf", "view", "fold", "fallback")


def constant_nodes(graph: Any) -> set[int]:
    """Nodes computed from weights and constants only (folded at compile time), as the
    e-graph's is_const analysis finds them."""
    const: set[int] = set()
    for n in graph.nodes:
        if n.op in CONST_SOURCES or (n.op not in NEVER_CONST and n.inputs
                                     and all(i in const for i in n.inputs)):
            const.add(n.id)
    return const


def program_cost(graph: Any, model: Any) -> float:
    """Predicted microseconds of a program, constant subgraphs excepted (any compiler folds
    them, so comparing with them in would flatter the optimized program)."""
    const = constant_nodes(graph)
    total = 0.0
    for node_id in graph.live_ids():
        n = graph.node(node_id)
        if node_id in const or n.op in VALUE_LEAVES:
            continue
        ins = [graph.node(i).type for i in n.inputs]
        if all(isinstance(t, TensorType) for t in ins):
            total += model.micros(n.op, n.attrs, ins, n.type)
        else:
            total += UNKNOWN_MICROS
    return total
