"""Why this program: one entry per kernel of the extracted program, for the report.

Each entry names the kernel (op, input and output types), its predicted cost under the model
extraction used, the rules that built it (recorded when they fired: egraph/provenance.py), and the
alternatives its e-class held, each with the change of the whole program's predicted cost had
it been chosen (alternatives.py); a kernel several others read also gets the price of not
sharing it. The entries are plain dicts: the report's JSON `kernels` (docs/report.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..ir import VALUE_LEAVES, Graph, TensorType, node_label
from ..ops import REGISTRY, gemm_label, get_op
from .alternatives import ProgramChoices

TERM_DEPTH = 2  # how deep an alternative's term is written out


@dataclass
class Decisions:
    """What extraction decided: the program's choices and the provenance rows."""

    program: ProgramChoices
    made: dict[str, tuple[str, ...]] = field(default_factory=dict)  # e-node -> rules
    class_ids: dict[str, int] = field(default_factory=dict)  # e-class -> final IR id

    def term(self, node_id: str, depth: int = TERM_DEPTH) -> str:
        """An e-node as an expression of its tensor operands: a class the program computes
        as `%id`, a weight by name, other classes by their cheapest node, `...` below
        `depth`; a gemm by its descriptor (gemm[rms_norm]), other attributes left out."""
        nodes = self.program.egraph.nodes
        node = nodes[node_id]
        opdef = REGISTRY[node.op]
        if node.op in ("param", "const", "input"):  # by name: the first attribute's literal
            name = self.program.choice(node.children[0], {}) if node.children else None
            return json.loads(nodes[name].op) if name is not None else node.op
        if opdef.arity is None:  # one Vec child listing the tensors
            vec = self.program.choice(node.children[0], {})
            operands = list(nodes[vec].children) if vec is not None else []
        else:
            operands = list(node.children[:opdef.arity])
        args = [self._operand(cls, depth) for cls in operands]
        return f"{self._label(node)}({', '.join(args)})"

    def _operand(self, cls: str, depth: int) -> str:
        child = self.program.choice(cls, {})
        if child is None:
            return "?"
        node = self.program.egraph.nodes[child]
        if node.op in ("input", "param"):
            return self.term(child)
        if cls in self.class_ids:
            return f"%{self.class_ids[cls]}"
        if depth > 1 or node.op in VALUE_LEAVES:
            return self.term(child, depth - 1)
        return f"{self._label(node)}(...)"

    def _label(self, node: Any) -> str:
        """The op, and a gemm's descriptor: its string attributes that are not the default."""
        if node.op != "gemm":
            return node.op
        nodes = self.program.egraph.nodes
        strings = [json.loads(nodes[n].op) for n in (self.program.choice(c, {}) for c in
                   node.children) if n is not None and nodes[n].op.startswith('"')]
        names = [name for name, kind in get_op("gemm").attrs if kind == "str"]  # in order
        return gemm_label(dict(zip(names, strings)))

    def explain(self, cls: str) -> dict[str, Any]:
        """The rules, alternatives and sharing of the kernel extracted from `cls`."""
        program = self.program
        chosen = program.choices[cls]
        alternatives, total = program.alternatives(cls)
        history = {r: None for n in program.egraph.classes[cls] if n != chosen
                   for r in self.made.get(n, ())}
        out: dict[str, Any] = {
            "rules": list(self.made.get(chosen, ())),
            "class_rules": [r for r in history if r not in self.made.get(chosen, ())],
            "alternatives": [{"op": program.egraph.nodes[a.node].op, "term": self.term(a.node),
                              "own_us": a.own_us, "delta_us": a.delta_us}
                             for a in alternatives],
            "alternatives_total": total}
        consumers = program.consumers(cls)
        delta, changes = program.unshared(cls) if len(consumers) > 1 else (None, {})
        if delta is not None:  # (a value every consumer needs as it is, such as the
            out["sharing"] = {  # residual stream, is shared without an alternative)
                "consumers": [self.class_ids.get(c) for c in consumers],
                "unshared_delta_us": delta,
                "unshared": [self.term(n) for n in changes.values()]}
        return out


def kernel_entries(graph: Graph, model: Any, eclass_of: dict[int, str],
                   decisions: Decisions | None = None) -> list[dict[str, Any]]:
    """One entry per live non-leaf node of `graph` (the optimized program, ids as in it).
    `eclass_of`: the e-class each node was extracted from (none for a folded constant)."""
    live = graph.live_ids()
    consumers: dict[int, int] = {}
    for n in graph.nodes:
        if n.id in live:
            for i in set(n.inputs):
                consumers[i] = consumers.get(i, 0) + 1
    entries = []
    for n in graph.nodes:
        if n.id not in live or n.op in VALUE_LEAVES:
            continue
        ins = [graph.node(i).type for i in n.inputs]
        cls = eclass_of.get(n.id)
        entry: dict[str, Any] = {
            "id": n.id, "op": n.op, "label": node_label(n), "operands": list(n.inputs),
            "inputs": [str(t) for t in ins], "output": str(n.type),
            "eclass": cls, "consumers": consumers.get(n.id, 0),
            "predicted_us": None, "flops": None, "bytes": None, "bound": None,
            "group": None, "measured_us": None, "rules": [], "class_rules": [],
            "alternatives": [], "alternatives_total": 0}
        if model is not None and isinstance(n.type, TensorType) and all(
                isinstance(t, TensorType) for t in ins):
            k = model.kernel(n.op, n.attrs, ins, n.type)
            entry.update(predicted_us=k.micros, flops=k.flops,
                         bytes=k.bytes_read + k.bytes_written, bound=k.bound)
        if decisions is not None and cls in decisions.program.choices:
            entry.update(decisions.explain(cls))
        entries.append(entry)
    return entries
