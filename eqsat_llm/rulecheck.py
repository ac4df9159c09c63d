"""Numerical checking of rewrite rules against the ops' reference semantics.

For each rule, random instances of its left-hand pattern(s) are built as IR graphs, encoded
into an e-graph, and the rule alone is applied by egglog (so its conditions are evaluated
exactly as during optimization). Every e-node the rule added to an e-class of the instance is
then decoded into a program, run by the reference runtime on random float64 inputs and compared
with the value of that e-class in the original instance; original nodes the rule merged are
compared with each other. How it works and how to read the output: docs/rule-checking.md.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import itertools
import json
import random
import re
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from egglog import EGraph
from egglog.bindings import EggSmolError
from egglog.declarations import (
    BiRewriteDecl,
    CallDecl,
    ClassMethodRef,
    EqDecl,
    ExprDecl,
    ExprFactDecl,
    FunctionRef,
    InitRef,
    LitDecl,
    RewriteDecl,
    RuleDecl,
    TypedExprDecl,
    UnboundVarDecl,
)
from egglog.runtime import RuntimeExpr

from . import rulebook
from .egraph import language
from .egraph.analysis import analysis, dtype_facts
from .egraph.decode import decode, let_classes, program_view, serialize
from .egraph.encode import encode, let_name
from .errors import EncodeError, GraphError, RuleError
from .extract import EGraph as XGraph
from .extract import ExtractionError, extract_tree_greedy, load_egraph, reachable_classes
from .ir import Graph, TensorType
from .ops import GEMM_ACTS, GEMM_PROLOGUES, REGISTRY, OpDef
from .rulebook import Rule, as_ruleset

STATUSES = ("pass", "fail", "ill-typed", "not-exercised")
TOLERANCE = {"exact": 1e-12, "reassociates": 1e-9}  # relative to max(1, max|expected|)
ROUNDS = 3  # rounds of [the rule, then the analysis to saturation] per instance
DIMS = (1, 2, 3, 4)
_draw = {"dims": DIMS}  # the sizes drawn: DIMS, or a rule's own (Rule.check_dims)
RANKS = (0, 1, 2, 2, 3, 3, 4)
SCALARS = (0.0, 1.0, -1.0, 2.0, 0.5)


@dataclass
class RuleCheck:
    rule: str
    family: str
    soundness: str
    status: str  # one of STATUSES
    instances_checked: int  # instances the rule fired on and whose alternatives were compared
    counterexample: dict[str, Any] | None = None
    message: str = ""
    max_error: float = 0.0  # largest error seen, relative to max(1, max|expected|)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "pass"


class _Retry(Exception):
    """This instance cannot be completed (no valid attribute, ill-typed); draw another."""


class _Unsupported(Exception):
    """The checker cannot instantiate this pattern at all."""


# --- patterns: the left-hand side(s) of a rule, read from its egglog declaration -------------
@dataclass
class _Pattern:
    roots: list[ExprDecl]  # op-call patterns the rule matches
    bound: dict[str, ExprDecl]  # tensor variable -> the pattern a fact eq(var).to(...) binds


def _is_op(e: ExprDecl) -> bool:
    return (isinstance(e, CallDecl) and isinstance(e.callable, FunctionRef)
            and e.callable.ident.module == language.__name__
            and e.callable.ident.name in REGISTRY)


def _vars(e: ExprDecl) -> set[str]:
    if isinstance(e, UnboundVarDecl):
        return {e.name}
    if isinstance(e, CallDecl):
        return set().union(*(_vars(a.expr) for a in e.args))
    return set()


def _show(e: ExprDecl) -> str:
    if isinstance(e, UnboundVarDecl):
        return e.name
    if isinstance(e, LitDecl):
        return repr(e.value)
    if isinstance(e, CallDecl):
        ref = e.callable
        name = getattr(ref, "method_name", None) or getattr(getattr(ref, "ident", None),
                                                             "name", "?")
        return f"{name}({', '.join(_show(a.expr) for a in e.args)})"
    return type(e).__name__


def _scan(roots: list[ExprDecl], facts: Iterable[Any]) -> _Pattern:
    bound: dict[str, ExprDecl] = {}
    for f in facts:
        if isinstance(f, EqDecl):
            left, right = f.left, f.right
            if isinstance(left, UnboundVarDecl) and _is_op(right):
                bound[left.name] = right
            elif isinstance(right, UnboundVarDecl) and _is_op(left):
                bound[right.name] = left
            else:
                roots.extend(e for e in (left, right) if _is_op(e))
        elif isinstance(f, ExprFactDecl) and _is_op(f.typed_expr.expr):
            roots.append(f.typed_expr.expr)
    used = set().union(set(), *(_vars(p) for p in [*roots, *bound.values()]))
    roots.extend(p for v, p in bound.items() if v not in used)
    return _Pattern(roots, bound)


def _patterns(rule: Rule) -> list[_Pattern]:
    decl = rule.command.decl
    if isinstance(decl, BiRewriteDecl):
        return [_scan([side], decl.conditions) for side in (decl.lhs, decl.rhs)]
    if isinstance(decl, RewriteDecl):
        return [_scan([decl.lhs], decl.conditions)]
    if isinstance(decl, RuleDecl):
        return [_scan([], decl.body)]
    raise _Unsupported(f"a {type(decl).__name__} is not a rewrite or a rule")


# --- random instances of a pattern -----------------------------------------------------------
# Types flow bottom-up (each node is type-checked by Graph.add as it is built) and demands flow
# down: an op asks for input types that fit the inputs it already has (mm's second input starts
# with the first one's last dim), and a view asked for a type takes it as its target shape and
# asks its own input for the same numel (so view -> bmm -> view chains type-check and fire); an
# expand asked for a type takes it as its target and asks its input for it with dims set to 1.
# A view or expand tells the one just below what it made of the shape (_Instance.unview), so
# view(expand(view(k))) chains (transformers' repeat_kv) are built as often as they fire.
Want = tuple[TensorType, int | None]  # a demanded type, and for int64 indices their bound


def _shape(rng: random.Random, rank: int | None = None) -> tuple[int, ...]:
    rank = rng.choice(RANKS) if rank is None else rank
    return tuple(rng.choice(_draw["dims"]) for _ in range(rank))


def _demand(rng: random.Random, op: str, pos: int, built: dict[int, TensorType]) -> Want | None:
    """A type for input `pos` of `op` that fits the inputs already built (by position); None:
    any type. Inputs that are sub-patterns are built before fresh leaves, so leaves adapt."""
    f, d = "float64", rng.choice(_draw["dims"])
    b = {i: t.shape for i, t in built.items()}

    def rank(*ranks: int) -> Want:
        return TensorType(_shape(rng, rng.choice(ranks)), f), None

    try:
        if op == "mm" or (op == "addmm" and pos > 0):
            i, j = (0, 1) if op == "mm" else (1, 2)
            if pos == i:
                return (TensorType((d, b[j][0]), f), None) if j in b else rank(2)
            return (TensorType((b[i][1], d), f), None) if i in b else rank(2)
        if op == "addmm":  # the bias
            return (TensorType((b[2][1],), f), None) if 2 in b else rank(1, 2)
        if op == "bmm":
            if pos == 0:
                return (TensorType((b[1][0], d, b[1][1]), f), None) if 1 in b else rank(3)
            return (TensorType((b[0][0], b[0][2], d), f), None) if 0 in b else rank(3)
        if op == "matmul":
            if pos == 0:
                return (TensorType((*b[1][:-2], d, b[1][-2]), f), None) if 1 in b else rank(2, 3)
            batch = b[0][:-2] if rng.random() < 0.25 else ()
            return (TensorType((*batch, b[0][-1], d), f), None) if 0 in b else rank(2)
        if op in ("linear", "linear_bias"):
            if pos == 0:
                return (TensorType((*_shape(rng, rng.choice((0, 1, 2))), b[1][1]), f), None) \
                    if 1 in b else rank(1, 2, 3)
            if pos == 1:
                return TensorType((b[2][0] if 2 in b else d, b[0][-1] if 0 in b else d), f), None
            return TensorType((b[1][0] if 1 in b else d,), f), None
        if op == "embedding":
            if pos == 0:
                return rank(2)
            return TensorType(_shape(rng, rng.choice((1, 2))), "int64"), b[0][0] if 0 in b else 1
        if op == "index_select" and pos == 1:
            return TensorType(_shape(rng, 1), "int64"), min(b[0]) if 0 in b else 1
        if op in ("sdpa", "sdpa_masked", "attention"):
            return _attention_input(rng, op, pos, b)
        if op == "gemm":  # x [M, K], w [K, N] (N even half the time: a SwiGLU pair), the
            # norm weight [K], the addend [N] (a bias or a residual row); w_scale unused
            k, n = (b[1][0], b[1][1]) if 1 in b else (b[0][-1] if 0 in b else d, d)
            n = 2 * n if 1 not in b and rng.random() < 0.5 else n
            shapes = {0: (rng.choice(_draw["dims"]), k), 1: (k, n), 2: (), 3: (k,), 4: (n,)}
            return TensorType(shapes[pos], f), None
        if op in ("layer_norm", "rms_norm"):  # (rms_norm: x, g)
            if pos > 0:
                return (TensorType(b[0][-1:], f), None) if 0 in b else rank(1)
            return (TensorType((*_shape(rng, rng.choice((0, 1, 2))), b[1][0]), f), None) \
                if 1 in b else None
        boolean = op.startswith(("logical_", "bitwise_")) or (op == "where" and pos == 0)
        like = [s for i, s in b.items() if not (op == "where" and i == 0)] or list(b.values())
        if REGISTRY[op].category == "elementwise" and like and rng.random() < 0.75:
            s = rng.choice(like)
            how = rng.random()  # the same shape, or one that broadcasts against it
            if 0.5 <= how < 0.75:
                s = s[-1:]
            elif how >= 0.75:
                s = tuple(1 if rng.random() < 0.5 else n for n in s[rng.randrange(len(s) + 1):])
            return TensorType(s, "bool" if boolean else f), None
        if boolean:
            return TensorType(_shape(rng), "bool"), None
    except (IndexError, KeyError, ValueError, TypeError):
        pass
    return None


def _attention_input(rng: random.Random, op: str, pos: int,
                     b: dict[int, tuple[int, ...]]) -> Want:
    """Input `pos` of sdpa / sdpa_masked / attention (q, k, v, mask or bias), 4-D and
    consistent with the inputs already built: q [B, H, Lq, E], k [B, Hk, Lk, E],
    v [B, Hk, Lk, Ev], with Hk = H or (k and v fresh, a fifth of the time) a divisor of H
    (grouped-query attention), H (the first input built) 4 or 6 half the time so that heads
    can be grouped; a mask or bias of rank 2 to 4 that broadcasts to [B, H, Lq, Lk] (often
    [Lq, Lk]), sdpa_masked's a bool mask (True = attend) half the time."""
    q, k, v = b.get(0), b.get(1), b.get(2)
    kv = k if k is not None else v

    def first(*dims: int | None) -> int:
        return next((n for n in dims if n is not None), rng.choice(_draw["dims"]))

    def at(s: tuple[int, ...] | None, i: int) -> int | None:
        return None if s is None else s[i]

    batch, lq, lk = first(at(q, 0), at(kv, 0)), first(at(q, 2)), first(at(kv, 2))
    heads, e = first(at(q, 1), at(kv, 1)), first(at(q, 3), at(k, 3))
    if q is None and kv is None and rng.random() < 0.5:
        heads = rng.choice((4, 6))  # heads that grouped-query attention can group
    if pos == 0:
        return TensorType((batch, heads, lq, e), "float64"), None
    if pos in (1, 2):
        if kv is not None:
            heads = kv[1]
        elif rng.random() < 0.2:
            heads = rng.choice([n for n in _draw["dims"] if heads % n == 0])
        return TensorType((batch, heads, lk, e if pos == 1 else first(at(v, 3))), "float64"), None
    full = (batch, heads, lq, lk)
    mask = full[-rng.choice((2, 2, 2, 3, 4)):]  # (torch's sdpa rejects a 1-D mask)
    mask = tuple(1 if rng.random() < 0.25 else n for n in mask)
    boolean = op == "sdpa_masked" and rng.random() < 0.5
    return TensorType(mask, "bool" if boolean else "float64"), None


def _unexpand(rng: random.Random, x: tuple[int, ...],
              split: tuple[int, ...] = ()) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """An input shape that expands to x, and the dims the expand broadcasts (from 1). Under a
    view that split one dim of x into two (`split`, dims i and i + 1: the view merges them),
    mostly one of those two (the inner one two times in three: k[:, :, None].expand(b, h, n,
    s, d).reshape(b, h * n, s, d) as transformers' repeat_kv, or a factor already 1, kept 1);
    else x itself a fifth of the time (a no-op expand), or x with one dim (often) or several
    set to 1; a leading dim dropped (expand adds leading dims) a sixth of the time."""
    how = rng.random()
    if split and how < 0.8:
        i = split[1] if rng.random() < 2 / 3 else split[0]
        out = [1 if j == i else n for j, n in enumerate(x)]
        return tuple(out), (i,)
    if how < 0.2 or not x:
        return x, ()
    if how < 0.8:
        i = rng.choice([i for i, n in enumerate(x) if n > 1] or range(len(x)))
        out = [1 if j == i else n for j, n in enumerate(x)]
    else:
        out = [1 if rng.random() < 0.5 else n for n in x]
    dims = [i for i, (a, b) in enumerate(zip(out, x)) if a != b]
    if rng.random() < 1 / 6:
        out, dims = out[1:], [i - 1 for i in dims if i > 0]
    return tuple(out), tuple(dims)


def _undo(x: tuple[int, ...], pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(dim, first factor) splits of x that undo a merge of two dims (`pairs`)."""
    return [(i, u) for i, n in enumerate(x) for u, v in pairs if u * v == n]


def _split(rng: random.Random, x: tuple[int, ...], pairs: list[tuple[int, int]]) -> list[int]:
    """x with one dim split in two: undoing a merge of the instance where one fits, else the
    leading dim half the time (torch.export merges batch and heads)."""
    return _split_at(rng, x, pairs)[0]


def _split_at(rng: random.Random, x: tuple[int, ...],
              pairs: list[tuple[int, int]]) -> tuple[list[int], int]:
    """_split, and the dim it split (dims i and i + 1 of the result)."""
    fits = _undo(x, pairs)
    if fits:
        i, u = rng.choice(fits)
    else:
        i = 0 if rng.random() < 0.5 else rng.randrange(len(x))
        factors = [f for f in _draw["dims"] if x[i] % f == 0]
        proper = [f for f in factors if 1 < f < x[i]]  # (n = 1 * n: an unsqueeze)
        u = rng.choice(proper if proper and rng.random() < 2 / 3 else factors)
    return [*x[:i], u, x[i] // u, *x[i + 1:]], i


def _view_shape(rng: random.Random, x: tuple[int, ...], seen: list[tuple[int, ...]],
                pairs: list[tuple[int, int]]) -> list[int]:
    """A target shape for a view of x: one dim split to undo a merge of the instance, x itself,
    two adjacent dims merged, one dim split, another shape of the instance with the same numel,
    or a random factorisation."""
    n = TensorType(x, "").numel
    how = rng.random()
    if how < 0.5 and _undo(x, pairs):
        return _split(rng, x, pairs)
    same = [t for t in seen if t != x and TensorType(t, "").numel == n]
    how = rng.random()
    if how < 0.2:
        return list(x)
    if how < 0.5 and len(x) >= 2:
        i = rng.randrange(len(x) - 1)
        return [*x[:i], x[i] * x[i + 1], *x[i + 2:]]
    if how < 0.7 and x:
        return _split(rng, x, pairs)
    if how < 0.8 and same:
        return list(rng.choice(same))
    return _factorise(rng, n)


def _factorise(rng: random.Random, n: int) -> list[int]:
    rank = rng.choice((0, 1, 2) if n == 1 else (1, 2, 2, 3, 3, 4))
    dims = [1] * rank
    p = 2
    while n > 1:
        while n % p == 0:
            dims[rng.randrange(rank)] *= p
            n //= p
        p += 1
    return dims


def _sample_attr(rng: random.Random, op: str, name: str, kind: str, types: list[TensorType],
                 attrs: dict[str, Any], graph: Graph) -> Any:
    """A random value for attribute `name` of `op`, knowing its input types and the attributes
    drawn before it. Raises _Retry when no valid value exists for these inputs."""
    x = types[0].shape if types else ()
    r = len(x)
    try:
        if op == "scalar":
            return rng.choice((*SCALARS, round(rng.uniform(-3, 3), 3))) if name == "value" \
                else "float"
        if op == "view":
            seen = [n.type.shape for n in graph.nodes if isinstance(n.type, TensorType)]
            return _view_shape(rng, x, seen, _merges(graph))
        if op == "expand":
            if rng.random() < 0.25:
                return list(x)
            new = [rng.choice((1, 2, 3)) if n == 1 and rng.random() < 0.5 else n for n in x]
            return ([rng.choice(_draw["dims"])] if rng.random() < 0.25 else []) + new
        if op == "permute":
            perm = list(range(r))
            if rng.random() >= 0.25:
                rng.shuffle(perm)
            return perm
        if op == "unsqueeze":
            return rng.randrange(r + 1)
        if name == "dims":  # reductions: the last dim half the time, else a non-empty set
            if r == 0:
                raise _Retry("a reduction of a 0-d tensor")
            return [r - 1] if rng.random() < 0.5 else sorted(rng.sample(range(r), rng.randint(1, r)))
        if kind == "bool":
            return rng.random() < 0.5
        if op == "slice" and name != "dim":
            size = x[attrs["dim"]]
            if name == "start":
                return rng.randrange(size)
            return rng.randint(attrs["start"] + 1, size) if name == "end" else rng.choice((1, 2))
        if op == "select" and name == "index":
            return rng.randrange(x[attrs["dim"]])
        if op == "cat":
            ok = [d for d in range(r) if all(len(t.shape) == r and all(
                a == b for i, (a, b) in enumerate(zip(t.shape, x)) if i != d) for t in types)]
            return rng.choice(ok)
        if name in ("dim", "dim0", "dim1"):
            if r == 0:
                raise _Retry(f"{op}.{name} of a 0-d tensor")
            return r - 1 if rng.random() < 0.5 else rng.randrange(r)
        if name in ("alpha", "beta"):
            return 1.0 if rng.random() < 0.5 else round(rng.uniform(-2, 2), 3)
        if name == "diagonal":
            return rng.choice((-1, 0, 1))
        if name == "normalized_shape":
            return list(types[1].shape) if len(types) > 1 else list(x[-1:])
        if name == "eps":
            return 1e-5
        if name == "scale":
            return round(rng.uniform(0.1, 1.0), 3)
        if name == "approximate":
            return rng.choice(("none", "tanh"))
        if op == "gemm":
            return _gemm_attr(rng, name, types, attrs)
        if name == "dtype":
            return rng.choice(("float64", "float64", "float32"))
    except (IndexError, ValueError, KeyError) as exc:
        raise _Retry(f"no valid {op}.{name} for inputs {types}") from exc
    defaults = {"int": lambda: rng.randrange(3), "float": lambda: rng.choice(SCALARS),
                "ints": lambda: list(_shape(rng)), "str": lambda: "float64"}
    return defaults[kind]()


def _gemm_attr(rng: random.Random, name: str, types: list[TensorType],
               attrs: dict[str, Any]) -> Any:
    """A gemm descriptor that fits its operands (_demand): n is the weight's width, or half of
    it for the SwiGLU epilogue."""
    width = types[1].shape[-1]
    if name == "n":
        return width // 2 if width % 2 == 0 and rng.random() < 0.3 else width
    if name == "prologue":
        return rng.choice(GEMM_PROLOGUES)
    if name == "epilogue":
        return "swiglu" if attrs["n"] != width else rng.choice(("none", "add", "bias"))
    if name == "act":
        return rng.choice(GEMM_ACTS)
    raise _Retry(f"gemm.{name}")


def _merges(graph: Graph) -> list[tuple[int, int]]:
    """The pairs of adjacent dims that views of the graph merged into one."""
    out = []
    for n in graph.nodes:
        if n.op == "view":
            x, y = graph.type_of(n.inputs[0]).shape, tuple(n.attrs["shape"])
            out += [(x[i], x[i + 1]) for i in range(len(x) - 1)
                    if y == (*x[:i], x[i] * x[i + 1], *x[i + 2:])]
    return out


def _literal(value: Any, kind: str) -> Any:
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


class _Instance:
    """One random IR graph matching a pattern: each tensor variable a leaf (`input` or `param`,
    one per distinct variable), each attribute variable a drawn value, literals as written."""

    def __init__(self, pattern: _Pattern, decls: Any, rng: random.Random):
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
            want = TensorType(shape_ if shape_ is not None else _shape(self.rng), "float64"), None
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
                    raise _Unsupported(f"tensor variable {e.name} is bound to a pattern "
                                       "containing itself")
                self.building.add(e.name)
                bound = self.pattern.bound.get(e.name)
                self.tensors[e.name] = (self.tensor(bound, want) if bound is not None
                                        else self.leaf(want))
            nid = self.tensors[e.name]
            if not isinstance(nid, int):
                raise _Unsupported(f"variable {e.name} is used both as a tensor and a list")
            return nid
        if not _is_op(e):
            raise _Unsupported(f"cannot build a tensor for {_show(e)}")
        if e not in self.memo:
            self.memo[e] = self.op(e, want)  # type: ignore[arg-type]
        return self.memo[e]

    def tensor_list(self, e: ExprDecl) -> list[int]:
        if isinstance(e, UnboundVarDecl):
            if e.name not in self.tensors:  # same shapes except along one axis
                base = _shape(self.rng, self.rng.choice((1, 2, 3)))
                axis = self.rng.randrange(len(base))
                self.tensors[e.name] = [self.leaf((TensorType(tuple(
                    self.rng.choice(_draw["dims"]) if i == axis else n for i, n in enumerate(base)),
                    "float64"), None)) for _ in range(self.rng.choice((1, 2, 3)))]
            ids = self.tensors[e.name]
            return ids if isinstance(ids, list) else [ids]
        if isinstance(e, CallDecl) and isinstance(e.callable, InitRef | ClassMethodRef):
            out: list[int] = []
            for a in e.args:
                out.append(self.tensor(a.expr, None if not out else (self.type(out[0]), None)))
            return out
        raise _Unsupported(f"cannot build a list of tensors for {_show(e)}")

    def type(self, nid: int) -> TensorType:
        return self.graph.type_of(nid)

    def attr(self, a: TypedExprDecl, op: str, name: str, kind: str, types: list[TensorType],
             attrs: dict[str, Any]) -> Any:
        e = a.expr
        if isinstance(e, UnboundVarDecl):
            if e.name not in self.attrs:
                self.attrs[e.name] = _sample_attr(self.rng, op, name, kind, types, attrs,
                                                  self.graph)
            return self.attrs[e.name]
        if isinstance(e, LitDecl):
            return _literal(e.value, kind)
        if _vars(e):
            raise _Unsupported(f"attribute {op}.{name} = {_show(e)} is computed from variables")
        return _literal(_evaluate(self.decls, a), kind)

    def unview(self, op: str, arg: ExprDecl, x: tuple[int, ...], how: str,
               dims: tuple[int, ...]) -> tuple[tuple[int, ...], Any]:
        """The shape a view or expand asked for x asks its input `arg` for, and what it made
        of it for a view or expand below: (shape, "split", the two dims it split one into) or
        (shape, "broadcast", the dims it expands). `how`, `dims`: what the view or expand just
        above made of x. A view splits one dim (undoing a merge of the instance where one
        fits), removes a 1 (an unsqueeze: mostly, under an expand that broadcasts that 1) or
        keeps x; a view of an expand mostly splits (reshape(expand(...)) merges what the
        expand broadcast); an expand sets dims to 1 (_unexpand)."""
        rng = self.rng
        if op == "expand":
            out, broadcast = _unexpand(rng, x, dims if how == "split" else ())
            return out, (out, "broadcast", broadcast)
        ones = [i for i, n in enumerate(x) if n == 1]
        hinted = [i for i in dims if x[i] == 1] if how == "broadcast" else []
        of_expand = _is_op(arg) and arg.callable.ident.name == "expand"  # type: ignore[attr-defined]
        if ones and not of_expand and rng.random() < (0.8 if hinted else 0.15):
            i = rng.choice(hinted or ones)
            return (*x[:i], *x[i + 1:]), None
        if x and rng.random() < (0.9 if of_expand else 0.7):
            out, i = _split_at(rng, x, _merges(self.graph))
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
            inputs = self.tensor_list(args[0])
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
                    demand = _demand(self.rng, opdef.name, i,
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


# --- applying the rule with egglog and comparing every alternative --------------------------
@contextmanager
def _encoded(base: EGraph, graph: Graph) -> Iterator[EGraph]:
    """`base` (one e-graph per rule, the analysis registered once: in a fresh e-graph that
    costs ~0.1 s, five times the rest of an instance) holding `graph` until the block ends."""
    base.push()
    try:
        encode(graph, egraph=base, sparsity=True)
        yield base
    finally:
        base.pop()


def _attr_value(view_nodes: dict[str, Any], nid: str, kind: str) -> Any:
    lit = view_nodes[nid]
    if kind == "ints":
        return tuple(int(view_nodes[c]["op"]) for c in lit["children"])
    if kind == "str":
        return json.loads(lit["op"])
    return float(lit["op"]) if kind == "float" else int(lit["op"])


def _norm(kind: str, value: Any) -> Any:
    return tuple(int(v) for v in value) if kind == "ints" else _literal(value, kind) if \
        kind != "bool" else int(value)


def _tensor_children(xg: XGraph, nid: str) -> tuple[str, ...]:
    node = xg.nodes[nid]
    arity = REGISTRY[node.op].arity
    if arity is None:
        return xg.nodes[xg.classes[node.children[0]][0]].children
    return node.children[:arity]


def _originals(graph: Graph, cls_of: dict[int, str], view: dict[str, Any],
               xg: XGraph) -> dict[str, int]:
    """e-node id -> the IR node of the instance it encodes."""
    want: dict[tuple[Any, ...], int] = {}
    for n in graph.nodes:
        attrs = tuple(_norm(k, n.attrs[a]) for a, k in REGISTRY[n.op].attrs)
        want[(cls_of[n.id], n.op, tuple(cls_of[i] for i in n.inputs), attrs)] = n.id
    out: dict[str, int] = {}
    for nid, node in xg.nodes.items():
        if node.op in REGISTRY and not node.subsumed:
            opdef = REGISTRY[node.op]
            kids = view["nodes"][nid]["children"][1 if opdef.arity is None else opdef.arity:]
            attrs = tuple(_norm(k, _attr_value(view["nodes"], c, k))
                          for (_, k), c in zip(opdef.attrs, kids))
            key = (node.eclass, node.op, _tensor_children(xg, nid), attrs)
            if key in want:
                out[nid] = want[key]
    return out


def _reachable(xg: XGraph, roots: list[str]) -> list[str]:
    seen = dict.fromkeys(roots)
    stack = list(roots)
    while stack:
        for nid in xg.classes[stack.pop()]:
            if not xg.nodes[nid].subsumed:
                for c in xg.nodes[nid].children:
                    if c not in seen:
                        seen[c] = None
                        stack.append(c)
    return list(seen)


def _error(expected: Any, got: Any) -> tuple[float, float] | None:
    """(max |got - expected|, max(1, max|expected|)); None if shapes or dtypes differ. Equal
    values (inf == inf) and NaN against NaN count as no error."""
    e, g = (torch.as_tensor(v, dtype=torch.float64) if not isinstance(v, torch.Tensor) else v
            for v in (expected, got))
    if e.shape != g.shape or e.dtype != g.dtype:
        return None
    e, g = e.double(), g.double()
    same = (e == g) | (e.isnan() & g.isnan())
    diff = torch.where(same, 0.0, (e - g).abs()).nan_to_num(nan=float("inf"))
    finite = e[e.isfinite()]
    scale = max(1.0, finite.abs().max().item() if finite.numel() else 0.0)
    return (diff.max().item() if diff.numel() else 0.0), scale


@dataclass
class _Outcome:
    compared: int = 0
    max_error: float = 0.0
    status: str = "pass"
    counterexample: dict[str, Any] | None = None
    message: str = ""


class _Checker:
    """Applies one rule to instances and compares what it added."""

    def __init__(self, rule: Rule):
        self.rule = rule
        self.tolerance = (rule.tolerance if rule.soundness == "approximate"
                          else TOLERANCE[rule.soundness])
        if self.tolerance is None:
            raise RuleError(f"approximate rule {rule.name!r} states no tolerance")
        self.rewrites = as_ruleset([rule])
        self.egraph = EGraph()
        try:
            # register the analysis (and below the rule) once
            self.egraph.register(*dtype_facts())
            self.egraph.run(analysis.saturate())
            self.egraph.run(self.rewrites)
        except EggSmolError as exc:
            raise _Unsupported(f"egglog rejects the rule: {exc}") from exc
        self.last_error = ""

    def run(self, inst: _Instance, gen: torch.Generator) -> _Outcome | None:
        """The outcome of the rule on this instance; None if it did not fire."""
        # the values first: the encoder reads the weights' structure off them
        inputs = inst.values(gen, self.rule.check_weights)
        with _encoded(self.egraph, inst.graph) as eg:
            try:
                eg.run(analysis.saturate())
            except EggSmolError as exc:  # egglog rejects this instance: draw another
                self.last_error = f"the analysis rejected an instance: {exc}"
                return None
            fired = False
            try:
                for _ in range(ROUNDS):
                    if not eg.run(self.rewrites).updated:
                        break
                    fired = True
                    eg.run(analysis.saturate())
                if not fired:
                    return None
                serialized = serialize(eg)
            except EggSmolError as exc:
                return _Outcome(1, 0.0, "ill-typed", inst.describe(),
                                f"egglog failed after the rule fired: {exc}")
        return self.compare(inst, serialized, inputs)

    def compare(self, inst: _Instance, serialized: dict[str, Any],
                inputs: list[Any]) -> _Outcome:
        g, tol, out = inst.graph, self.tolerance, _Outcome()
        classes = let_classes(serialized)
        cls_of = {n.id: classes[let_name(n.id)] for n in g.nodes}
        class_types: dict[str, Any] = {}
        first: dict[str, int] = {}  # e-class -> the first instance node in it
        for n in g.nodes:
            c = cls_of[n.id]
            first.setdefault(c, n.id)
            if class_types.setdefault(c, n.type) != n.type:
                return _Outcome(1, 0.0, "ill-typed", inst.describe(),
                                f"the rule merged %{first[c]} : {class_types[c]} with "
                                f"%{n.id} : {n.type}")
        values = _run(dataclasses.replace(g, outputs=[n.id for n in g.nodes]), inputs)

        def refuted(status: str, message: str, expected: str, alternative: str,
                    err: tuple[float, float] | None = None) -> _Outcome:
            out.status, out.message = status, message
            out.counterexample = {**inst.describe(), "expected": expected,
                                  "alternative": alternative, "max_error": err and err[0],
                                  "tolerance": err and tol * err[1]}
            return out

        def agrees(expected: Any, got: Any, expected_text: str, alternative: str,
                   what: str = "") -> bool:
            err, what = _error(expected, got), what or alternative
            if err is None:
                refuted("ill-typed", f"{what} changed the type of {expected_text}",
                        expected_text, alternative)
                return False
            out.compared += 1
            out.max_error = max(out.max_error, err[0] / err[1])
            if err[0] > tol * err[1]:
                refuted("fail", f"{what} differs from {expected_text} by {err[0]:.3g} "
                        f"(tolerance {tol * err[1]:.3g})", expected_text, alternative, err)
            return out.status == "pass"

        # original nodes the rule put in one e-class must agree (union(y, x) rules)
        for n in g.nodes:
            c = cls_of[n.id]
            if first[c] != n.id and not agrees(
                    values[first[c]], values[n.id], str(g.node(first[c])), str(n),
                    f"{str(n).split(' : ')[0]}, which the rule merged with it,"):
                return out
        # every e-node in every e-class reachable from the instance's roots, in a program that
        # elsewhere chooses the instance's own nodes (or, in classes the rule created, the
        # cheapest acyclic ones)
        roots = [cls_of[i] for i in g.outputs]
        try:
            view = program_view(serialized, roots)
        except EncodeError as exc:
            return _Outcome(1, 0.0, "ill-typed", inst.describe(), str(exc))
        xg = load_egraph(view)
        original = _originals(g, cls_of, view, xg)
        reach = [c for c in _reachable(xg, roots) if xg.nodes[xg.classes[c][0]].op in REGISTRY]
        try:
            default = {c: ns[0] for c, ns in xg.classes.items() if xg.nodes[ns[0]].op
                       not in REGISTRY} | extract_tree_greedy(xg, reach, lambda n: 0.0 if
                       n.op not in REGISTRY else 1.0 if n.id in original else 1000.0).choices
        except ExtractionError as exc:
            return _Outcome(1, 0.0, "fail", inst.describe(), f"no acyclic program: {exc}")
        names = {c: f"%{i}" for c, i in first.items()}

        def evaluate(choices: dict[str, str], c: str) -> Any:
            prog, ids = decode(view, choices, [c], g, class_types)
            prog.outputs = ids
            return _run(prog, inputs)[ids[0]]

        for c in reach:
            if c in first:
                expected, expected_text = values[first[c]], str(g.node(first[c]))
            else:  # a class the rule created: its nodes against its default program
                expected_text = _term(xg, default, c, names)
                try:
                    expected = evaluate(default, c)
                except (EncodeError, GraphError) as exc:
                    return refuted("ill-typed", f"{expected_text} is ill-typed: {exc}",
                                   expected_text, expected_text)
            for nid in xg.classes[c]:
                node = xg.nodes[nid]
                if node.subsumed or node.op not in REGISTRY or nid in original or (
                        c not in first and default[c] == nid):
                    continue
                choices = {**default, c: nid}
                try:
                    reachable_classes(xg, choices, [c])
                except ExtractionError:
                    continue  # choosing this node here is cyclic
                alternative = _term(xg, choices, c, names)
                try:
                    got = evaluate(choices, c)
                except (EncodeError, GraphError) as exc:
                    return refuted("ill-typed", f"{alternative}, which the rule made equal to "
                                   f"{expected_text}, is ill-typed: {exc}", expected_text,
                                   alternative)
                if not agrees(expected, got, expected_text, alternative):
                    return out
        return out


def _term(xg: XGraph, choices: dict[str, str], c: str, names: dict[str, str],
          depth: int = 0) -> str:
    """The chosen program for class c as a term; instance classes below the top by their %id."""
    if depth and c in names:
        return names[c]
    node = xg.nodes[choices[c]]
    if not node.children:
        return node.op
    args = ", ".join(_term(xg, choices, k, names, depth + 1) for k in node.children)
    return f"[{args}]" if node.op == "Vec" else f"{node.op}({args})"


def _run(graph: Graph, inputs: list[Any]) -> dict[int, Any]:
    from .codegen import ReferenceRuntime

    with torch.no_grad():
        return dict(zip(graph.outputs, ReferenceRuntime(graph).run(inputs)))


# --- the API ----------------------------------------------------------------------------------
def check_rule(rule: Rule, *, instances: int = 20, seed: int = 0,
               max_attempts: int = 2000) -> RuleCheck:
    """Check `rule` on up to `instances` random instances it fires on (at most `max_attempts`
    draws, of which at most max(200, 20 * instances) reach egglog)."""
    start = time.perf_counter()

    def done(status: str, n: int, cex: dict[str, Any] | None, msg: str,
             err: float = 0.0) -> RuleCheck:
        return RuleCheck(rule.name, rule.family, rule.soundness, status, n, cex,
                         " ".join(msg.split()), err, time.perf_counter() - start)

    try:
        patterns = _patterns(rule)
    except _Unsupported as exc:
        return done("not-exercised", 0, None, str(exc))
    if not any(p.roots for p in patterns):
        return done("not-exercised", 0, None, "the rule matches no op pattern")
    shown = " / ".join(", ".join(_show(r) for r in p.roots) for p in patterns)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    _draw["dims"] = rule.check_dims or DIMS
    try:
        return _check(rule, patterns, shown, rng, gen, instances, max_attempts, done)
    finally:
        _draw["dims"] = DIMS


def _check(rule: Rule, patterns: list[_Pattern], shown: str, rng: random.Random,
           gen: torch.Generator, instances: int, max_attempts: int, done: Any) -> RuleCheck:
    try:
        checker = _Checker(rule)
    except _Unsupported as exc:
        return done("not-exercised", 0, None, str(exc))
    checked = typed = fired = 0
    worst = 0.0
    last_error = ""
    for attempt in range(max_attempts):
        if checked >= instances or typed >= max(200, 20 * instances):
            break
        try:
            inst = _Instance(patterns[attempt % len(patterns)], rule.command.__egg_decls__, rng)
        except (GraphError, _Retry) as exc:
            last_error = str(exc)
            continue
        except _Unsupported as exc:
            return done("not-exercised", 0, None, f"pattern {shown}: {exc}")
        typed += 1
        outcome = checker.run(inst, gen)
        if outcome is None:
            continue
        fired += 1
        worst = max(worst, outcome.max_error)
        if outcome.status != "pass":
            return done(outcome.status, checked + 1, outcome.counterexample, outcome.message,
                        worst)
        checked += outcome.compared > 0
    if checked:
        note = "" if checked >= instances else f"checked {checked} of {instances} instances"
        return done("pass", checked, None, note, worst)
    if not typed:
        msg = (f"pattern {shown} could not be instantiated in {max_attempts} attempts"
               f" (last error: {last_error[:200]})")
    elif not fired:
        msg = (f"pattern {shown} was instantiated {typed} times but the rule never fired "
               f"(its conditions never held) {checker.last_error[:200]}")
    else:
        msg = f"the rule fired {fired} times but left nothing to compare (every choice cyclic)"
    return done("not-exercised", 0, None, msg.strip())


def check_rules(rules: Iterable[Rule], **kwargs: Any) -> list[RuleCheck]:
    return [check_rule(r, **kwargs) for r in rules]


_loaded = itertools.count()


def _rules_in(module: ModuleType) -> list[Rule]:
    """The module's rules (rulebook.rules_of_module); for a package, its submodules' too."""
    found = rulebook.rules_of_module(module)
    if not found and hasattr(module, "__path__"):
        for value in vars(module).values():
            if isinstance(value, ModuleType) and value.__name__.startswith(module.__name__ + "."):
                found.extend(_rules_in(value))
    seen: set[str] = set()
    return [r for r in found if not (r.name in seen or seen.add(r.name))]


def load_rules_from(spec: str) -> list[Rule]:
    """The rules of a .py file (imported under a fresh module name, so a file can be loaded
    twice or reuse the library's rule names), of a family of the library (or "all"), or of an
    importable module."""
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise RuleError(f"no rule file {spec!r}")
        name = f"_eqsat_rules_{next(_loaded)}_" + re.sub(r"\W", "_", path.stem)
        module_spec = importlib.util.spec_from_file_location(name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except RuleError:  # a family that raised: the message names its file and line
            del sys.modules[name]
            raise
        except Exception as exc:
            del sys.modules[name]
            raise RuleError(f"rule file {spec!r} raised on import{_line_in(exc, path)}: "
                            f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            del sys.modules[name]
            raise
        return _rules_in(module)
    families = rulebook.load_library()
    if spec == "all" or spec in families:
        return rulebook.resolve([spec])
    try:
        module = importlib.import_module(spec)
    except ImportError as exc:
        raise RuleError(f"{spec!r} is not a rule file, a rule family or an importable module: "
                        f"{exc}") from exc
    except RuleError:
        raise
    except Exception as exc:  # the module itself raised while importing
        raise RuleError(f"rule module {spec!r} raised on import: {type(exc).__name__}: "
                        f"{exc}") from exc
    return _rules_in(module)


def _line_in(exc: BaseException, path: Path) -> str:
    """' (line N)': the last line of the file `path` in exc's traceback; '' if none."""
    line, tb = None, exc.__traceback__
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve() == path.resolve():
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is None and isinstance(exc, SyntaxError) and exc.lineno:
        line = exc.lineno
    return f" (line {line})" if line else ""


def main_check(specs: list[str], *, instances: int = 20, seed: int = 0,
               max_attempts: int = 2000) -> int:
    """`eqsat-llm rules check [FILE_OR_MODULE ...]`: print one row per rule; 1 if any rule is
    not "pass", else 0. No specs: the whole library."""
    rules: list[Rule] = []
    for spec in specs or ["all"]:
        rules.extend(load_rules_from(spec))
    print(f"{'rule':<28}{'family':<12}{'soundness':<14}{'status':<15}{'inst':>5}{'sec':>7}  "
          "max error / message")
    bad = 0
    for rule in rules:
        res = check_rule(rule, instances=instances, seed=seed, max_attempts=max_attempts)
        err = f"{res.max_error:.2g}" if res.status in ("pass", "fail") else "-"
        detail = err + (f"  {res.message}" if res.message else "")
        print(f"{res.rule:<28}{res.family:<12}{res.soundness:<14}{res.status:<15}"
              f"{res.instances_checked:>5}{res.seconds:>7.2f}  {detail}", flush=True)
        if not res.ok:
            bad += 1
            if res.counterexample:
                cex = {k: v for k, v in res.counterexample.items()
                       if k not in ("instance", "alternative")}
                print(f"    counterexample: {json.dumps(cex, default=str)}")
                for key in ("instance", "alternative"):
                    if res.counterexample.get(key):
                        text = str(res.counterexample[key]).replace("\n", "\n        ")
                        print(f"    {key}:\n        {text}")
    print(f"{len(rules) - bad} of {len(rules)} rules pass")
    return 1 if bad else 0
