"""A rule's left-hand side(s), read from its egglog declaration: the op patterns it matches,
and the tensor variables its facts bind to patterns. Every other fact is a condition, which
egglog evaluates."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from egglog.declarations import (
    BiRewriteDecl,
    CallDecl,
    EqDecl,
    ExprDecl,
    ExprFactDecl,
    FunctionRef,
    LitDecl,
    MethodRef,
    RewriteDecl,
    RuleDecl,
    UnboundVarDecl,
)

from ..egraph import language
from ..ops import REGISTRY
from ..rulebook import Rule


class Unsupported(Exception):
    """The checker cannot instantiate this pattern at all."""


@dataclass
class Pattern:
    roots: list[ExprDecl]  # op-call patterns the rule matches
    bound: dict[str, ExprDecl]  # tensor variable -> the pattern a fact eq(var).to(...) binds
    # list variable -> its elements a fact eq(xs[i]).to(...) binds (a pattern or a tensor
    # variable), by index
    elements: dict[str, dict[int, ExprDecl]] = field(default_factory=dict)


def is_op(e: ExprDecl) -> bool:
    """An op of the registry (E.<op>), not an analysis function or a primitive's method."""
    return (isinstance(e, CallDecl) and isinstance(e.callable, FunctionRef)
            and e.callable.ident.module == language.__name__
            and e.callable.ident.name in REGISTRY)


def variables(e: ExprDecl) -> set[str]:
    """The names of the variables in e."""
    if isinstance(e, UnboundVarDecl):
        return {e.name}
    if isinstance(e, CallDecl):
        return set().union(*(variables(a.expr) for a in e.args))
    return set()


def show(e: ExprDecl) -> str:
    if isinstance(e, UnboundVarDecl):
        return e.name
    if isinstance(e, LitDecl):
        return repr(e.value)
    if isinstance(e, CallDecl):
        ref = e.callable
        name = getattr(ref, "method_name", None) or getattr(getattr(ref, "ident", None),
                                                             "name", "?")
        return f"{name}({', '.join(show(a.expr) for a in e.args)})"
    return type(e).__name__


def _element(e: ExprDecl) -> tuple[str, int] | None:
    """(xs, i) for the element xs[i] of a list variable at a literal index."""
    if isinstance(e, CallDecl) and isinstance(e.callable, MethodRef) and \
            e.callable.method_name == "__getitem__":
        xs, i = e.args[0].expr, e.args[1].expr
        if isinstance(xs, UnboundVarDecl) and isinstance(i, LitDecl):
            return xs.name, int(i.value)  # type: ignore[arg-type]
    return None


def _scan(roots: list[ExprDecl], facts: Iterable[Any]) -> Pattern:
    bound: dict[str, ExprDecl] = {}
    elements: dict[str, dict[int, ExprDecl]] = {}
    for f in facts:
        if isinstance(f, EqDecl):
            left, right = f.left, f.right
            if _element(right) is not None:
                left, right = right, left
            if (at := _element(left)) is not None and \
                    (is_op(right) or isinstance(right, UnboundVarDecl)):
                elements.setdefault(at[0], {})[at[1]] = right
            elif isinstance(left, UnboundVarDecl) and is_op(right):
                bound[left.name] = right
            elif isinstance(right, UnboundVarDecl) and is_op(left):
                bound[right.name] = left
            else:
                roots.extend(e for e in (left, right) if is_op(e))
        elif isinstance(f, ExprFactDecl) and is_op(f.typed_expr.expr):
            roots.append(f.typed_expr.expr)
    used = set().union(set(), *(variables(p) for p in [*roots, *bound.values()]))
    roots.extend(p for v, p in bound.items() if v not in used)
    return Pattern(roots, bound, elements)


def read_patterns(rule: Rule) -> list[Pattern]:
    decl = rule.command.decl
    if isinstance(decl, BiRewriteDecl):
        return [_scan([side], decl.conditions) for side in (decl.lhs, decl.rhs)]
    if isinstance(decl, RewriteDecl):
        return [_scan([decl.lhs], decl.conditions)]
    if isinstance(decl, RuleDecl):
        return [_scan([], decl.body)]
    raise Unsupported(f"a {type(decl).__name__} is not a rewrite or a rule")
