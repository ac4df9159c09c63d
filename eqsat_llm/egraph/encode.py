"""IR graph -> egglog e-graph, one `let` per node.

LLM graphs are thousands of nodes deep; egglog-python converts nested terms recursively, so
each node is bound to its own `let` and refers to its inputs by their let names. Shapes are
asserted only for leaves and for ops whose shape the e-graph cannot derive ("given" rules);
everything else is computed by the analysis (analysis.py). Dtypes are asserted for every node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from egglog import EGraph, String, Vec, f64, i64, set_

from ..errors import EncodeError
from ..half import exact_half_dtypes
from ..ir import Graph, TensorType
from ..ops import get_op
from ..sparse_formats import structure
from .analysis import (
    HALF_EXACT,
    dtype_facts,
    hi_id,
    lo_id,
    quantizable,
    shape_literal,
    stored_blocks,
    two_four,
)
from .language import E, Tensor, dtype, shape


@dataclass
class Encoded:
    egraph: EGraph
    graph: Graph
    let_names: dict[int, str] = field(default_factory=dict)  # IR node id -> let name
    exprs: dict[int, Tensor] = field(default_factory=dict)  # IR node id -> let expression


def attr_literal(kind: str, value: Any) -> Any:
    if kind in ("int", "bool"):
        return i64(int(value))
    if kind == "float":
        return f64(float(value))
    if kind == "ints":
        return Vec[i64](*(int(v) for v in value)) if len(value) else Vec[i64].empty()
    if kind == "str":
        return String(str(value))
    raise EncodeError(f"unknown attribute kind {kind!r}")


def _structure_facts(expr: Any, value: Any) -> list[Any]:
    """The sparsity facts of a constant (none for a dense one, or one not yet known)."""
    found = structure(value) if isinstance(value, torch.Tensor) else None
    if found is None:
        return []
    facts: list[Any] = [two_four(expr, i64(d)) for d in (0, 1) if found.two_four[d]]
    if found.blocks is not None and 0 < found.blocks < found.total_blocks:
        facts.append(set_(stored_blocks(expr)).to(i64(found.blocks)))
    return facts


def let_name(node_id: int) -> str:
    return f"n{node_id}"


def encode(graph: Graph, *, assert_shapes: bool = False, egraph: EGraph | None = None,
           keep_float: Callable[[str], bool] | None = None, sparsity: bool = False) -> Encoded:
    """Encode the live part of `graph`. With `assert_shapes`, every node's shape is asserted
    (used only to compare against the analysis in tests: normally the analysis derives them).
    `egraph`: encode into this e-graph instead of a new one (the rule checker reuses one,
    with push()/pop() per instance). `keep_float(name)`: the weights that the quantize rules
    leave alone (analysis.quantizable: every other weight leaf). `sparsity`: read the 2:4 and
    16 x 16 block structure off the values of the constant matrices (analysis.two_four,
    stored_blocks), for the sparsity rules. Every constant whose values fit a half dtype
    exactly is marked so (analysis.fp16_exact, bf16_exact: rules/half_weights.py)."""
    egraph = EGraph() if egraph is None else egraph
    enc = Encoded(egraph, graph)
    facts: list[Any] = list(dtype_facts())
    live = graph.live_ids()
    for node in graph.nodes:
        if node.id not in live:
            continue
        opdef = get_op(node.op)
        inputs = [enc.exprs[i] for i in node.inputs]
        if opdef.arity is None:
            inputs = [Vec[Tensor](*inputs) if inputs else Vec[Tensor].empty()]
        attrs = [attr_literal(kind, node.attrs[name]) for name, kind in opdef.attrs]
        expr = egraph.let(let_name(node.id), getattr(E, node.op)(*inputs, *attrs))
        enc.let_names[node.id] = let_name(node.id)
        enc.exprs[node.id] = expr
        if isinstance(node.type, TensorType):
            if assert_shapes or opdef.shape_rule == "given":
                facts.append(set_(shape(expr)).to(shape_literal(node.type.shape)))
            facts.append(set_(dtype(expr)).to(String(node.type.dtype)))
        if node.op in ("param", "const"):
            facts += [set_(lo_id(expr)).to(i64(node.id)), set_(hi_id(expr)).to(i64(node.id))]
            if keep_float is None or not keep_float(node.attrs["name"]):
                facts.append(quantizable(expr))
            value = graph.constants.get(node.attrs["name"])
            if isinstance(value, torch.Tensor):
                facts += [HALF_EXACT[dt](expr) for dt in exact_half_dtypes(value)]
            if sparsity:
                facts += _structure_facts(expr, value)
    egraph.register(*facts)
    return enc
