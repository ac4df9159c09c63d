"""Whether the extracted program uses what a rule produced.

egglog records how often a rule matched, not which e-nodes it created, so use is judged on
the extracted program by the shape of the rule's result: a rule whose result is a new term
(`... .to(E.rms_norm(x, w, eps))`) is used when the program contains that term's op skeleton
(ops and the string attributes the rule spells out, as a gemm's descriptor; variables and
other attributes match anything); a rule that only merges a term with an
existing one (`x * 1 -> x`) is used when the input program had its left side and the output
no longer does. It is a heuristic: a skeleton can also be present for another reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from egglog.declarations import CallDecl, EqDecl, LitDecl, RewriteDecl, RuleDecl, UnionDecl

from .ir import Graph
from .ops import REGISTRY
from .rulebook import Rule


@dataclass(frozen=True)
class Skeleton:
    op: str
    children: tuple[Skeleton | None, ...]  # None: matches anything
    strings: frozenset[str] = frozenset()  # string attributes the node must have


def _skeleton(expr: Any) -> Skeleton | None:
    if isinstance(expr, CallDecl) and hasattr(expr.callable, "ident"):
        name = expr.callable.ident.name
        if name in REGISTRY:
            arity = REGISTRY[name].arity or 1
            strings = frozenset(a.expr.value for a in expr.args[arity:]
                                if isinstance(a.expr, LitDecl) and isinstance(a.expr.value, str))
            return Skeleton(name, tuple(_skeleton(a.expr) for a in expr.args[:arity]), strings)
    return None


def result_and_pattern(rule: Rule) -> tuple[list[Skeleton], list[Skeleton]]:
    """Skeletons of what the rule builds, and of the patterns it matches."""
    decl = rule.command.decl
    if isinstance(decl, RewriteDecl):
        built, matched = [_skeleton(decl.rhs)], [_skeleton(decl.lhs)]
    elif isinstance(decl, RuleDecl):
        built = [_skeleton(a.rhs) for a in decl.head if isinstance(a, UnionDecl)]
        matched = [_skeleton(f.right) for f in decl.body if isinstance(f, EqDecl)]
    else:
        return [], []
    return [s for s in built if s], [s for s in matched if s]


def _matches(graph: Graph, node_id: int, skel: Skeleton) -> bool:
    node = graph.node(node_id)
    if node.op == "gemm" and skel.op != "gemm":
        return _matches_gemm_part(graph, node, skel)
    if node.op != skel.op or not skel.strings <= {v for v in node.attrs.values()
                                                   if isinstance(v, str)}:
        return False
    for i, child in enumerate(skel.children):
        if child is not None and (i >= len(node.inputs)
                                  or not _matches(graph, node.inputs[i], child)):
            return False
    return True


def _matches_gemm_part(graph: Graph, node: Any, skel: Skeleton) -> bool:
    """A gemm with the rms_norm prologue is matmul(rms_norm(x, g), w) in one op, one with the
    SwiGLU epilogue swiglu(x @ wg, x @ wu): a skeleton of a part matches it (the norm, the
    merged projection, the SwiGLU are still used)."""
    if node.attrs["prologue"] == "rms_norm" and skel.op in ("matmul", "rms_norm"):
        return _matches_norm_matmul(graph, node.inputs, skel)
    if node.attrs["epilogue"] == "swiglu" and skel.op == "swiglu":
        return all(c is None or c.op == "matmul" for c in skel.children)
    return False


def _matches_norm_matmul(graph: Graph, inputs: tuple[int, ...], skel: Skeleton) -> bool:
    x, w, _, g, _ = inputs

    def all_match(children: tuple[Skeleton | None, ...], ids: tuple[int, ...]) -> bool:
        return all(c is None or _matches(graph, i, c) for c, i in zip(children, ids))
    if skel.op == "rms_norm":
        return all_match(skel.children, (x, g))
    inner = skel.children[0] if skel.children else None
    if inner is not None and not (inner.op == "rms_norm" and all_match(inner.children, (x, g))):
        return False
    return all_match(skel.children[1:2], (w,))


def contains(graph: Graph, skel: Skeleton) -> bool:
    live = graph.live_ids()
    return any(_matches(graph, n.id, skel) for n in graph.nodes if n.id in live)


def rule_used(rule: Rule, before: Graph, after: Graph) -> bool:
    built, matched = result_and_pattern(rule)
    # a result under a view (free; the layout rules cancel it against its consumer's view) is
    # also judged by the term beneath it, where that term is new (addmm-view-gelu)
    built += [c for s in built if s.op == "view" for c in s.children[:1]
              if c is not None and not contains(before, c)]
    if built:
        return any(contains(after, s) for s in built)
    return any(contains(before, s) and not contains(after, s) for s in matched)
