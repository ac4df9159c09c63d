"""A random IR graph matching a rule's pattern: leaves for tensor variables, drawn attribute
values (draws.py), literals as written."""

from __future__ import annotations

import random
from typing import Any

import torch
from egglog import EGraph
from egglog.declarations import (
    CallDecl,
    ClassMethodRef,
    ExprDecl,
    InitRef,
    LitDecl,
    TypedExprDecl,
    UnboundVarDecl,
)
from egglog.runtime import RuntimeExpr

from ..ir import Graph, TensorType
from ..ops import REGISTRY, OpDef
from .draws import (
    DRAW,
    Want,
    draw_shape,
    input_demand,
    merges,
    sample_attr,
    split_at,
    unexpand,
)
from .patterns import Pattern, Unsupported, is_op, show, variables


def literal(value: Any, kind: str) -> Any:
    """A value of a pattern (or of the e-graph) as an attribute of kind `kind`."""
    if kind == "bool":
        return bool(value)
    if kind == "ints":
        return [int(v) for v in value]
    return {"int": int, "float": float, "str": str}[kind](value)


_EVALUATED: dict[TypedExprDecl, Any] = {}


def _evaluate(decls: Any, typed: TypedExprDecl) -> Any:
    """The value of a variable-free primitive expression (a literal Vec, `f64(1.0) / 8.0`)."""
    e = typed.expr
    if isinstance(e, CallDecl) and isinstance(e.callable, InitRef | ClassMethodRef) and all(
            isinstance(a.expr, LitDecl) for a in e.args):
        return [a.expr.value for a in e.args]  # Vec[i64](1, 0), Vec[i64].empty()
    if typed not in _EVALUATED:
        value = EGraph().extract(RuntimeExpr.__from_values__(decls, typed)).value
        _EVALUATED[typed] = [v.value for v in value] if isinstance(value, tuple) else value
    return _EVALUATED[typed]


class Instance:
    """One random IR graph matching a pattern: each tensor variable a leaf (`input` or `param`,
    one per distinct variable), each attribute variable a drawn value, literals as written."""

    def __init__(self, pattern: Pattern, decls: Any, rng: random.Random):
        self.pattern, self.decls, self.rng = pattern, decls, rng
        self.graph = Graph()
        self.tensors: dict[str, int | list[int]] = {}
        self.attrs: dict[str, Any] = {}
        self.bounds: dict[int, int] = {}  # int64 leaf -> exclusive bound of its values
        self.memo: dict[ExprDecl, int] = {}
        self.building: set[str] = set()
        self.made: tuple[tuple[int, ...], str, tuple[int, ...]] | None = None  # see op()
        roots = [self.tensor(p, None) for p in pattern.roots]
        self.graph.outputs = list(dict.fromkeys(roots))

    def leaf(self, want: Want | None) -> int:
        leaves = [n.type.shape for n in self.graph.nodes if n.op in ("input", "param")]
        if want is None:
            shape_ = self.rng.choice(leaves) if leaves and self.rng.random() < 0.33 else None
            shape_ = shape_ if shape_ is not None else draw_shape(self.rng)
            want = TensorType(shape_, DRAW["dtype"]), None
        k = len(self.graph.input_ids)
        if self.rng.random() < 0.5:  # an input, or a weight (rules may require constness)
            nid = self.graph.append("input", (), {"name": f"in{k}", "index": k}, want[0])
        else:
            nid = self.graph.append("param", (), {"name": f"w{len(self.graph.nodes)}"}, want[0])
        if want[1] is not None:
            self.bounds[nid] = want[1]
        return nid

    def tensor(self, e: ExprDecl, want: Want | None) -> int:
        if isinstance(e, UnboundVarDecl):
            if e.name not in self.tensors:
                if e.name in self.building:
                    raise Unsupported(f"tensor variable {e.name} is bound to a pattern "
                                       "containing itself")
                self.building.add(e.name)
                bound = self.pattern.bound.get(e.name)
                self.tensors[e.name] = (self.tensor(bound, want) if bound is not None
                                        else self.leaf(want))
            nid = self.tensors[e.name]
            if not isinstance(nid, int):
                raise Unsupported(f"variable {e.name} is used both as a tensor and a list")
            return nid
        if not is_op(e):
            raise Unsupported(f"cannot build a tensor for {show(e)}")
        if e not in self.memo:
            self.memo[e] = self.op(e, want)  # type: ignore[arg-type]
        return self.memo[e]

    def tensor_list(self, e: ExprDecl, axis: int | None = None) -> list[int]:
        if isinstance(e, UnboundVarDecl) and e.name in self.pattern.elements:
            # elements bound by facts (xs[0] a pattern, xs[1] a tensor...): each after the
            # first like it, but along the axis (a cat's dim) of a drawn size, often 1
            ids: list[int] = []
            for _, x in sorted(self.pattern.elements[e.name].items()):
                want = None
                if ids:
                    shape_ = list(self.type(ids[0]).shape)
                    if axis is not None and -len(shape_) <= axis < len(shape_):
                        shape_[axis] = self.rng.choice((1, 1, *DRAW["dims"]))
                    want = TensorType(tuple(shape_), DRAW["dtype"]), None
                ids.append(self.tensor(x, want))
            return ids
        if isinstance(e, UnboundVarDecl):
            if e.name not in self.tensors:  # same shapes except along one axis
                base = draw_shape(self.rng, self.rng.choice((1, 2, 3)))
                axis = self.rng.randrange(len(base))
                self.tensors[e.name] = [self.leaf((TensorType(tuple(
                    self.rng.choice(DRAW["dims"]) if i == axis else n for i, n in enumerate(base)),
                    DRAW["dtype"]), None)) for _ in range(self.rng.choice((1, 2, 3)))]
            ids = self.tensors[e.name]
            return ids if isinstance(ids, list) else [ids]
        if isinstance(e, CallDecl) and isinstance(e.callable, InitRef | ClassMethodRef):
            out: list[int] = []
            for a in e.args:
                out.append(self.tensor(a.expr, None if not out else (self.type(out[0]), None)))
            return out
        raise Unsupported(f"cannot build a list of tensors for {show(e)}")

    def type(self, nid: int) -> TensorType:
        return self.graph.type_of(nid)

    def attr(self, a: TypedExprDecl, op: str, name: str, kind: str, types: list[TensorType],
             attrs: dict[str, Any]) -> Any:
        e = a.expr
        if isinstance(e, UnboundVarDecl):
            if e.name not in self.attrs:
                self.attrs[e.name] = sample_attr(self.rng, op, name, kind, types, attrs,
                                                  self.graph)
            return self.attrs[e.name]
        if isinstance(e, LitDecl):
            return literal(e.value, kind)
        if variables(e):
            raise Unsupported(f"attribute {op}.{name} = {show(e)} is computed from variables")
        return literal(_evaluate(self.decls, a), kind)

    def unview(self, op: str, arg: ExprDecl, x: tuple[int, ...], how: str,
               dims: tuple[int, ...]) -> tuple[tuple[int, ...], Any]:
        """The shape a view or expand asked for x asks its input `arg` for, and what it made
        of it for a view or expand below: (shape, "split", the two dims it split one into) or
        (shape, "broadcast", the dims it expands). `how`, `dims`: what the view or expand just
        above made of x. A view splits one dim (undoing a merge of the instance where one
        fits), removes a 1 (an unsqueeze: mostly, under an expand that broadcasts that 1) or
        keeps x; a view of an expand mostly splits (reshape(expand(...)) merges what the
        expand broadcast); an expand sets dims to 1 (unexpand)."""
        rng = self.rng
        if op == "expand":
            out, broadcast = unexpand(rng, x, dims if how == "split" else ())
            return out, (out, "broadcast", broadcast)
        ones = [i for i, n in enumerate(x) if n == 1]
        hinted = [i for i in dims if x[i] == 1] if how == "broadcast" else []
        of_expand = is_op(arg) and arg.callable.ident.name == "expand"  # type: ignore[attr-defined]
        if ones and not of_expand and rng.random() < (0.8 if hinted else 0.15):
            i = rng.choice(hinted or ones)
            return (*x[:i], *x[i + 1:]), None
        if x and rng.random() < (0.9 if of_expand else 0.7):
            out, i = split_at(rng, x, merges(self.graph))
            return tuple(out), (tuple(out), "split", (i, i + 1))
        return x, None

    def op(self, e: CallDecl, want: Want | None) -> int:
        opdef: OpDef = REGISTRY[e.callable.ident.name]  # type: ignore[union-attr]
        n_in = 1 if opdef.arity is None else opdef.arity
        args = [a.expr for a in e.args]
        made, self.made = self.made, None  # what a view or expand just above made of `want`
        if opdef.name in ("view", "expand") and want is not None:  # become the wanted shape
            s = args[1]
            if isinstance(s, UnboundVarDecl) and s.name not in self.attrs:
                self.attrs[s.name] = list(want[0].shape)
            x = want[0].shape
            hint = made[1:] if made is not None and made[0] == x else ("", ())
            unviewed, self.made = self.unview(opdef.name, args[0], x, *hint)
            want = TensorType(tuple(unviewed), want[0].dtype), None
        if opdef.arity is None:
            dim = args[1] if len(args) > 1 else None
            inputs = self.tensor_list(args[0], int(dim.value) if isinstance(dim, LitDecl) and
                                      isinstance(dim.value, int) else None)
        else:  # sub-patterns first, then fresh leaves, which adapt to them
            def fresh(a: ExprDecl) -> bool:
                return isinstance(a, UnboundVarDecl) and a.name not in self.tensors and \
                    a.name not in self.pattern.bound
            built: dict[int, int] = {}
            # (addmm's bias last among fresh leaves: it adapts to the product's width)
            last = 0 if opdef.shape_rule == "addmm" else -1
            for i in sorted(range(n_in), key=lambda i: (fresh(args[i]), i == last)):
                if opdef.name in ("view", "expand"):
                    demand = want
                else:
                    demand = input_demand(self.rng, opdef.name, i,
                                     {j: self.type(k) for j, k in built.items()})
                    if demand is None and opdef.category == "elementwise":
                        demand = want
                built[i] = self.tensor(args[i], demand)
                self.made = None
            inputs = [built[i] for i in range(n_in)]
        types = [self.type(i) for i in inputs]
        attrs: dict[str, Any] = {}
        for (name, kind), a in zip(opdef.attrs, e.args[n_in:]):
            attrs[name] = self.attr(a, opdef.name, name, kind, types, attrs)
        return self.graph.add(opdef.name, inputs, **attrs)

    def values(self, gen: torch.Generator, weights: Any = None) -> list[Any]:
        """Random values of the leaves: the inputs in call order; params go to constants,
        shaped by `weights(value, gen)` when the rule asks (Rule.check_weights)."""
        out = []
        for n in self.graph.nodes:
            if n.op not in ("input", "param"):
                continue
            nid, t = n.id, self.type(n.id)
            if t.dtype == "bool":
                out.append(torch.rand(t.shape, generator=gen) < 0.5)
            elif t.dtype == "int64":
                low, high = (0, self.bounds[nid]) if nid in self.bounds else (-3, 4)
                out.append(torch.randint(low, high, t.shape, generator=gen))
            else:
                x = torch.randn(t.shape, generator=gen, dtype=torch.float64)
                out.append(x.to(getattr(torch, t.dtype)))
            if n.op == "param":
                value = out.pop()
                self.graph.constants[n.attrs["name"]] = weights(value, gen) if weights else value
        return out

    def describe(self) -> dict[str, Any]:
        def typ(v: int | list[int]) -> Any:
            return [str(self.type(i)) for i in v] if isinstance(v, list) else str(self.type(v))
        return {"leaves": {name: typ(v) for name, v in self.tensors.items()},
                "attributes": dict(self.attrs), "instance": str(self.graph)}
