"""Provenance: which rule built which e-node, recorded as the rules fire.

egglog counts a rule's matches but does not say what its firings built. So each rule is run
in an instrumented form: besides its own actions, every firing inserts a row into a relation
per op, `made_<op>(rule name, <the arguments of the term it built>)`, for every term of the
op constructors its right side builds (`E.gemm(E.rms_norm(x, g), ...)` records both). The
rows' tensor arguments are e-classes, kept canonical by egglog as classes merge, so after
saturation a row names one e-node exactly: its op and its children. A rule whose right side
builds nothing (`x * 1 -> x`) records `merged(rule name, the class it merged into)`.

The rewrite `rewrite(L).to(R, *conditions)` is run as the rule egglog makes of it anyway,
`rule(eq(root).to(L), *conditions).then(union(root).with_(R))`, plus the rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from typing import Any

from egglog import RewriteOrRule, Ruleset, String, Vec, f64, i64, relation, ruleset
from egglog.declarations import (
    CallDecl,
    Declarations,
    EqDecl,
    ExprActionDecl,
    LetDecl,
    RewriteDecl,
    RuleDecl,
    TypedExprDecl,
    UnboundVarDecl,
    UnionDecl,
)
from egglog.runtime import RuntimeExpr

from ..ops import REGISTRY
from ..rulebook import Rule
from .decode import is_literal
from .language import ATTR_SORTS, Tensor

MADE = "made_"  # prefix of the relations (their tables are not part of the e-graph's size)
_SORTS = {"i64": i64, "f64": f64, "Vec[i64]": Vec[i64], "String": String}


@cache
def made_relation(op: str) -> Any:
    """The relation `made_<op>(String, <op's arguments>)`."""
    opdef = REGISTRY[op]
    tensors = [Vec[Tensor]] if opdef.arity is None else [Tensor] * opdef.arity
    attrs = [_SORTS[ATTR_SORTS[kind]] for _, kind in opdef.attrs]
    return relation(MADE + op, String, *tensors, *attrs)


@cache
def merged_relation() -> Any:
    return relation(MADE + "merged", String, Tensor)


def _built_terms(expr: Any) -> Iterator[CallDecl]:
    """The op-constructor calls of a right side, outermost first."""
    if isinstance(expr, CallDecl):
        ident = getattr(expr.callable, "ident", None)
        if ident is not None and ident.name in REGISTRY and ident.module.endswith("language"):
            yield expr
        for arg in expr.args:
            yield from _built_terms(arg.expr)


def _records(decls: Declarations, name: str, built: list[TypedExprDecl],
             merged: list[TypedExprDecl]) -> list[RuntimeExpr]:
    label = String(name)
    rows = []
    for typed in built:
        for call in _built_terms(typed.expr):
            args = [RuntimeExpr.__from_values__(decls, a) for a in call.args]
            rows.append(made_relation(call.callable.ident.name)(label, *args))
    for typed in merged:
        rows.append(merged_relation()(label, RuntimeExpr.__from_values__(decls, typed)))
    return rows


_INSTRUMENTED: dict[int, tuple[Rule, RewriteOrRule]] = {}  # id(rule) -> (rule, its form)


def instrumented(rule: Rule) -> RewriteOrRule:
    """The rule with its provenance rows added to its actions (the rule itself where its form
    is not one of the two the library writes: a rewrite without subsumption, or a rule)."""
    hit = _INSTRUMENTED.get(id(rule))
    if hit is None or hit[0] is not rule:
        hit = _INSTRUMENTED[id(rule)] = (rule, _instrumented(rule.name, rule.command))
    return hit[1]


def recording_ruleset(rules: list[Rule]) -> Ruleset:
    """The rules, instrumented, as one ruleset (what saturation runs)."""
    return ruleset(*(instrumented(r) for r in rules), name="rewrites")


def _instrumented(name: str, command: RewriteOrRule) -> RewriteOrRule:
    decl, decls = command.decl, command.__egg_decls__
    if isinstance(decl, RewriteDecl) and not decl.subsume:
        root = UnboundVarDecl("__provenance_root")
        body = (EqDecl(decl.tp, root, decl.lhs), *decl.conditions)
        head: tuple[Any, ...] = (UnionDecl(decl.tp, root, decl.rhs),)
    elif isinstance(decl, RuleDecl):
        body, head = decl.body, decl.head
    else:
        return command
    built, merged = [], []
    for action in head:
        if isinstance(action, UnionDecl):
            rhs = TypedExprDecl(action.tp, action.rhs)
            if isinstance(action.rhs, CallDecl):
                built.append(rhs)
            else:  # x * 1 -> x: nothing built, two classes merged
                merged.append(TypedExprDecl(action.tp, action.lhs))
        elif isinstance(action, (LetDecl, ExprActionDecl)):
            built.append(action.typed_expr)
    rows = _records(decls, name, built, merged)
    if not rows:
        return command
    rule_name = decl.name if isinstance(decl, RuleDecl) else None  # as the author named it
    return RewriteOrRule(Declarations.create(command, *rows), RuleDecl(
        (*head, *(ExprActionDecl(r.__egg_typed_expr__) for r in rows)), body, rule_name))


def _child_key(nodes: dict[str, Any], node_id: str) -> Any:
    """A child as provenance compares it: an e-class, or (literals and vectors, which the
    serializer splits per use) by value."""
    node = nodes[node_id]
    if node["op"] == "Vec" or is_literal(node["op"]):
        return (node["op"], tuple(_child_key(nodes, c) for c in node["children"]))
    return node["eclass"]


def _node_key(nodes: dict[str, Any], op: str, children: list[str]) -> tuple[Any, ...]:
    return (op, *(_child_key(nodes, c) for c in children))


def read(serialized: dict[str, Any]) -> tuple[dict[str, tuple[str, ...]],
                                               dict[str, tuple[str, ...]]]:
    """The rows recorded in a serialized e-graph: e-node id -> the rules that built it, and
    e-class -> the rules that merged a class into it."""
    nodes = serialized["nodes"]
    made: dict[tuple[Any, ...], list[str]] = {}
    merged: dict[str, list[str]] = {}
    for n in nodes.values():
        if not n["op"].startswith(MADE):
            continue
        rule = json.loads(nodes[n["children"][0]]["op"])
        if n["op"] == MADE + "merged":
            merged.setdefault(nodes[n["children"][1]]["eclass"], []).append(rule)
        else:
            key = _node_key(nodes, n["op"][len(MADE):], n["children"][1:])
            made.setdefault(key, []).append(rule)
    by_node = {}
    for nid, n in nodes.items():
        if n["op"] in REGISTRY:
            rules = made.get(_node_key(nodes, n["op"], n["children"]))
            if rules:
                by_node[nid] = tuple(dict.fromkeys(rules))
    return by_node, {cls: tuple(dict.fromkeys(r)) for cls, r in merged.items()}


def rules_used(choices: dict[str, str], made: dict[str, tuple[str, ...]],
               merged: dict[str, tuple[str, ...]]) -> set[str]:
    """The rules whose results an extracted program (class -> chosen e-node) uses: a rule
    that built one of its e-nodes, or that merged a class of it with another term (the
    merged-away term, `x * 1` of `x * 1 -> x`, now reads its own class: never chosen)."""
    used = {r for node in choices.values() for r in made.get(node, ())}
    return used | {r for cls, rules in merged.items() if cls in choices for r in rules}


def rules_in_classes(egraph: Any, choices: dict[str, str],
                     made: dict[str, tuple[str, ...]]) -> set[str]:
    """The rules that built any e-node of the program's e-classes: besides those it uses,
    the rules whose results a later rule matched to build what it uses (`mm-as-matmul`
    building the matmul that `rms-norm-matmul` fused), and alternatives it did not choose."""
    return {r for cls in choices for node in egraph.classes[cls] for r in made.get(node, ())}
