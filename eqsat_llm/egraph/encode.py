"""IR graph -> egglog e-graph, one `let` per node.

LLM graphs are thousands of nodes deep; egglog-python converts nested terms recursively, so
each node is bound to its own `let` and refers to its inputs by their let names. Shapes are
asserted only for leaves and for ops whose shape the e-graph cannot derive ("given" rules);
everything else is computed by the analysis (analysis.py). Dtypes are asserted for every node.

The lets and facts are built as egglog's own commands (`egglog.bindings`) and run as one
program: going through egglog-python's expression layer (a typed Python object per term, its
declarations merged into the e-graph's at every `let`) cost 2.5 ms a node, 9 s for 32 LLaMA
layers; the commands cost a few microseconds each (benchmarks/scale.py). The constructors are
the same functions (language.py); `Encoded.exprs` still gives an egglog-python expression per
node (a reference to its let), for reading the e-graph back in Python.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
from egglog import EGraph, String, bindings
from egglog.declarations import LetRefDecl, TypedExprDecl
from egglog.egraph_state import _normalize_global_let_name
from egglog.runtime import RuntimeExpr

from ..errors import EncodeError
from ..formats.sparse_formats import structure
from ..ir import Graph, TensorType
from ..ops import get_op
from ..weights.meta import half_dtypes
from .analysis import (
    HALF_EXACT,
    dtype_facts,
    hi_id,
    keep_mask,
    lo_id,
    quantizable,
    stored_blocks,
    two_four,
)
from .language import E, dtype, shape

_SPAN = bindings.RustSpan("", 0, 0)


@dataclass
class Encoded:
    egraph: EGraph
    graph: Graph
    let_names: dict[int, str] = field(default_factory=dict)  # IR node id -> let name
    exprs: dict[int, Any] = field(default_factory=dict)  # IR node id -> let expression


def _lit(value: Any) -> Any:
    return bindings.Lit(_SPAN, value)


def _vec(items: list[Any]) -> Any:
    if not items:  # an empty vector's sort is its parameter's: egglog infers it
        return bindings.Call(_SPAN, "vec-empty", [])
    return bindings.Call(_SPAN, "vec-of", items)


def attr_literal(kind: str, value: Any) -> Any:
    """An attribute's value as an egglog literal (language.ATTR_SORTS gives its sort)."""
    if kind in ("int", "bool"):
        return _lit(bindings.Int(int(value)))
    if kind == "float":
        return _lit(bindings.Float(float(value)))
    if kind == "ints":
        return _vec([_lit(bindings.Int(int(v))) for v in value])
    if kind == "str":
        return _lit(bindings.String(str(value)))
    raise EncodeError(f"unknown attribute kind {kind!r}")


class _Program:
    """The encoding's commands, in order: lets, then the facts about them. It reaches below
    egglog-python's public API (the bindings e-graph, its names for functions and lets), which
    is why egglog is pinned to one major version (pyproject.toml); tests/test_roundtrip.py
    reads every encoded node back."""

    def __init__(self, egraph: EGraph):
        self.egraph = egraph
        self.lets: list[Any] = []
        self.facts: list[Any] = []
        self._names: dict[int, str] = {}

    def fn(self, callable_: Any) -> str:
        """egglog's name of a constructor, function or relation (declared on first use)."""
        key = id(callable_)  # the constructors and analyses are module-level: ids are stable
        if key not in self._names:
            self._names[key] = self.egraph._callable_to_egg(callable_)[1]
        return self._names[key]

    def let(self, name: str, op: str, args: list[Any]) -> Any:
        var = bindings.Var(_SPAN, _normalize_global_let_name(name))
        self.lets.append(bindings.ActionCommand(bindings.Let(
            _SPAN, var.name, bindings.Call(_SPAN, self.fn(getattr(E, op)), args))))
        return var

    def set(self, function: Any, args: list[Any], value: Any) -> None:
        self.facts.append(bindings.ActionCommand(bindings.Set(_SPAN, self.fn(function), args,
                                                              value)))

    def mark(self, relation: Any, args: list[Any]) -> None:
        self.facts.append(bindings.ActionCommand(bindings.Expr_(
            _SPAN, bindings.Call(_SPAN, self.fn(relation), args))))

    def run(self) -> None:
        self.egraph._egraph.run_program(*self.lets, *self.facts)


def _structure_facts(program: _Program, var: Any, value: Any) -> None:
    """The sparsity facts of a constant (none for a dense one, or one not yet known)."""
    found = structure(value) if isinstance(value, torch.Tensor) else None
    if found is None:
        return
    for d in (0, 1):
        if found.two_four[d]:
            program.mark(two_four, [var, _lit(bindings.Int(d))])
    if found.blocks is not None and 0 < found.blocks < found.total_blocks:
        program.set(stored_blocks, [var], _lit(bindings.Int(found.blocks)))


@cache
def _tensor_sort() -> Any:
    """egglog-python's reference to the sort Tensor, read off one (unregistered) term."""
    return E.param(String("")).__egg_typed_expr__.tp


def _reference(egraph: EGraph, name: str, tensor: Any) -> RuntimeExpr:
    """An egglog-python expression naming the let `name` (what `EGraph.let` returns)."""
    return RuntimeExpr.__from_values__(egraph.__egg_decls__, TypedExprDecl(tensor, LetRefDecl(
        name)))


def declared(*rulesets: Any) -> EGraph:
    """A new e-graph with these rulesets declared, for a program to be encoded into. egglog
    checks each new rule against every global let: the 480 rules declared after the 3,500 lets
    of 32 LLaMA layers took 3.6 s of CPU, declared before them 0.4 s (saturation then finds
    them declared: the same rules, the same e-graph)."""
    egraph = EGraph()
    for rs in rulesets:
        egraph.run(0, ruleset=rs)  # zero iterations: declares the ruleset, runs nothing
    return egraph


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
    egraph.register(*dtype_facts())
    enc = Encoded(egraph, graph)
    program = _Program(egraph)
    vars_: dict[int, Any] = {}
    live = graph.live_ids()
    for node in graph.nodes:
        if node.id not in live:
            continue
        opdef = get_op(node.op)
        inputs = [vars_[i] for i in node.inputs]
        if opdef.arity is None:
            inputs = [_vec(inputs)]
        attrs = [attr_literal(kind, node.attrs[name]) for name, kind in opdef.attrs]
        var = vars_[node.id] = program.let(let_name(node.id), node.op, inputs + attrs)
        enc.let_names[node.id] = let_name(node.id)
        if isinstance(node.type, TensorType):
            if assert_shapes or opdef.shape_rule == "given":
                program.set(shape, [var], attr_literal("ints", node.type.shape))
            program.set(dtype, [var], _lit(bindings.String(node.type.dtype)))
        if node.op in ("param", "const"):
            _leaf_facts(program, var, node.id, node.attrs["name"],
                        graph.constants.get(node.attrs["name"]),
                        keep_float is not None and keep_float(node.attrs["name"]), sparsity)
    program.run()
    tensor = _tensor_sort()
    enc.exprs = {i: _reference(egraph, name, tensor) for i, name in enc.let_names.items()}
    return enc


KEEP_MASK_NUMEL = 1 << 22  # masks are position tables; a weight is refused by its first column


def is_keep_mask(value: torch.Tensor) -> bool:
    """A float constant of 0s and 1s whose every row (last dim) starts with a 1: a
    multiplicative mask that keeps each row's first key (analysis.keep_mask)."""
    if (not value.is_floating_point() or value.is_meta or value.dim() == 0
            or value.numel() == 0 or value.numel() > KEEP_MASK_NUMEL):
        return False
    if not bool((value[..., 0] == 1).all()):  # cheap: a weight fails here
        return False
    return bool(((value == 0) | (value == 1)).all())


def _leaf_facts(program: _Program, var: Any, node_id: int, name: str, value: Any,
                keep_float: bool, sparsity: bool) -> None:
    """A weight's facts: its number (lo_id/hi_id, for merging parallel GEMMs), whether the
    quantize rules may store it as integers, which half dtypes hold it exactly, whether it is a
    keep mask, and (with `sparsity`) its sparsity structure."""
    number = _lit(bindings.Int(node_id))
    program.set(lo_id, [var], number)
    program.set(hi_id, [var], number)
    if not keep_float:
        program.mark(quantizable, [var])
    if isinstance(value, torch.Tensor):
        for dt in half_dtypes(value, name):
            program.mark(HALF_EXACT[dt], [var])
        if is_keep_mask(value):
            program.mark(keep_mask, [var])
    if sparsity:
        _structure_facts(program, var, value)
