"""One rule applied by egglog to instances, and every alternative it added run by the
reference runtime and compared with the instance's values."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from egglog import EGraph
from egglog.bindings import EggSmolError

from ..egraph.analysis import analysis, dtype_facts
from ..egraph.decode import decode, let_classes, program_view, serialize
from ..egraph.encode import encode, let_name
from ..errors import EncodeError, GraphError, RuleError
from ..extraction.egraph_json import EGraph as XGraph
from ..extraction.egraph_json import load_egraph
from ..extraction.extract import (
    ExtractionError,
    extract_tree_greedy,
    reachable_classes,
)
from ..ir import Graph
from ..ops import REGISTRY
from ..rulebook import Rule, as_ruleset
from .instances import Instance, literal
from .patterns import Unsupported

TOLERANCE = {"exact": 1e-12, "reassociates": 1e-9}  # relative to max(1, max|expected|)
ROUNDS = 3  # rounds of [the rule, then the analysis to saturation] per instance


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
    return tuple(int(v) for v in value) if kind == "ints" else literal(value, kind) if \
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
class Outcome:
    compared: int = 0
    max_error: float = 0.0
    status: str = "pass"
    counterexample: dict[str, Any] | None = None
    message: str = ""


class Checker:
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
            raise Unsupported(f"egglog rejects the rule: {exc}") from exc
        self.last_error = ""

    def run(self, inst: Instance, gen: torch.Generator) -> Outcome | None:
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
                return Outcome(1, 0.0, "ill-typed", inst.describe(),
                                f"egglog failed after the rule fired: {exc}")
        return self.compare(inst, serialized, inputs)

    def compare(self, inst: Instance, serialized: dict[str, Any],
                inputs: list[Any]) -> Outcome:
        g, tol, out = inst.graph, self.tolerance, Outcome()
        classes = let_classes(serialized)
        cls_of = {n.id: classes[let_name(n.id)] for n in g.nodes}
        class_types: dict[str, Any] = {}
        first: dict[str, int] = {}  # e-class -> the first instance node in it
        for n in g.nodes:
            c = cls_of[n.id]
            first.setdefault(c, n.id)
            if class_types.setdefault(c, n.type) != n.type:
                return Outcome(1, 0.0, "ill-typed", inst.describe(),
                                f"the rule merged %{first[c]} : {class_types[c]} with "
                                f"%{n.id} : {n.type}")
        values = _run(dataclasses.replace(g, outputs=[n.id for n in g.nodes]), inputs)

        def refuted(status: str, message: str, expected: str, alternative: str,
                    err: tuple[float, float] | None = None) -> Outcome:
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
            return Outcome(1, 0.0, "ill-typed", inst.describe(), str(exc))
        xg = load_egraph(view)
        original = _originals(g, cls_of, view, xg)
        reach = [c for c in _reachable(xg, roots) if xg.nodes[xg.classes[c][0]].op in REGISTRY]
        try:
            default = {c: ns[0] for c, ns in xg.classes.items() if xg.nodes[ns[0]].op
                       not in REGISTRY} | extract_tree_greedy(xg, reach, lambda n: 0.0 if
                       n.op not in REGISTRY else 1.0 if n.id in original else 1000.0).choices
        except ExtractionError as exc:
            return Outcome(1, 0.0, "fail", inst.describe(), f"no acyclic program: {exc}")
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
    from ..codegen import ReferenceRuntime

    with torch.no_grad():
        return dict(zip(graph.outputs, ReferenceRuntime(graph).run(inputs)))
