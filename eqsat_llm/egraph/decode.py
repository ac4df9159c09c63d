"""Serialized e-graph + an extraction -> IR graph.

egglog serializes the e-graph in the egraph-serialize JSON format. `program_view` keeps the
nodes that can be part of a program (op constructors and the literals of their attributes) and
drops the analyses and helper functions, so that extractors see only real choices. `decode`
turns the chosen node of each reachable class back into IR nodes, in dependency order.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import EncodeError
from ..ir import Graph, TensorType, ValueType
from ..ops import REGISTRY, get_op


def serialize(egraph: Any) -> dict[str, Any]:
    """The e-graph as egraph-serialize JSON (primitive outputs split into their own classes,
    as egglog does by default, so a literal is never confused with a function's value)."""
    return json.loads(egraph._serialize(split_primitive_outputs=True).to_json())


def is_literal(op: str) -> bool:
    """A primitive literal (i64, f64, String) or a container of literals/classes (Vec)."""
    if op == "Vec" or op.startswith('"'):
        return True
    try:
        float(op)
    except ValueError:
        return op in ("inf", "-inf", "NaN")
    return True


def program_view(serialized: dict[str, Any], roots: list[str]) -> dict[str, Any]:
    """Keep op constructors and the literals they read; the analysis functions and relations
    are dropped, and so are the literals only those read (the provenance rows' rule names)."""
    everything = serialized["nodes"]
    nodes = {nid: n for nid, n in everything.items() if n["op"] in REGISTRY}
    work = [c for n in nodes.values() for c in n["children"]]
    while work:  # the literals (and vectors of them) the constructors read
        nid = work.pop()
        if nid not in nodes and nid in everything and is_literal(everything[nid]["op"]):
            nodes[nid] = everything[nid]
            work.extend(everything[nid]["children"])
    kept = set(nodes)
    for nid, n in nodes.items():
        missing = [c for c in n["children"] if c not in kept]
        if missing:
            raise EncodeError(f"node {nid} ({n['op']}) has children outside the program: "
                              f"{missing[:3]}")
    return {"nodes": nodes, "root_eclasses": list(roots),
            "class_data": serialized.get("class_data", {})}


def let_classes(serialized: dict[str, Any]) -> dict[str, str]:
    """let name -> e-class id, read from the serializer's class_data."""
    out: dict[str, str] = {}
    for cls, data in serialized.get("class_data", {}).items():
        for name in (data.get("let") or "").split(","):
            name = name.strip().removeprefix("$")
            if name:
                out[name] = cls
    return out


def class_types(serialized: dict[str, Any]) -> dict[str, TensorType]:
    """The type of every tensor e-class whose shape and dtype the analysis computed, read from
    the serialized `shape(t)` and `dtype(t)` nodes (for the cost model)."""
    nodes = serialized["nodes"]
    literal_of: dict[str, dict[str, Any]] = {}
    for n in nodes.values():
        if is_literal(n["op"]):
            literal_of.setdefault(n["eclass"], n)
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    for n in nodes.values():
        if n["op"] not in ("shape", "dtype") or not n["children"]:
            continue
        tensor_class = nodes[n["children"][0]]["eclass"]
        lit = literal_of.get(n["eclass"])
        if lit is None:
            continue
        if n["op"] == "shape":
            shapes[tensor_class] = tuple(
                int(literal_of[nodes[c]["eclass"]]["op"]) for c in lit["children"])
        else:
            dtypes[tensor_class] = json.loads(lit["op"])
    return {c: TensorType(shapes[c], dtypes[c]) for c in shapes if c in dtypes}


def node_attrs(view: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """The attribute values of one e-node, from the literals among its children."""
    nodes = view["nodes"]
    opdef = get_op(node["op"])
    attr_nodes = node["children"][1 if opdef.arity is None else opdef.arity:]
    attrs: dict[str, Any] = {}
    for (name, kind), child in zip(opdef.attrs, attr_nodes):
        lit = nodes[child]
        if kind == "ints":
            attrs[name] = [int(nodes[c]["op"]) for c in lit["children"]]
        else:
            attrs[name] = _literal(lit["op"], kind)
    return attrs


def _literal(op: str, kind: str) -> Any:
    if kind in ("int", "bool"):
        v = int(op)
        return bool(v) if kind == "bool" else v
    if kind == "float":
        return float(op)
    if kind == "str":
        return json.loads(op)
    raise EncodeError(f"cannot read a {kind} attribute from literal {op!r}")


def decode(view: dict[str, Any], choices: dict[str, str], roots: list[str], source: Graph,
           class_types: dict[str, ValueType],
           class_ids: dict[str, int] | None = None) -> tuple[Graph, list[int]]:
    """Build the IR graph of the chosen program. `class_types` gives the known type of the
    classes that hold nodes of `source` (all nodes of a class have one type); a node of a new
    class gets its type from the op's inference. Returns the graph and the ids of the roots;
    `class_ids`, when given, is filled with the IR id built for each e-class."""
    nodes = view["nodes"]
    by_key = {n.attrs["key"]: n for n in source.nodes if n.op == "fallback"}
    inputs_by_name = {n.attrs["name"]: n for n in source.nodes if n.op == "input"}
    out = Graph(constants=dict(source.constants))
    built: dict[str, int] = {} if class_ids is None else class_ids  # e-class -> IR id

    def node_of(cls: str) -> dict[str, Any]:
        try:
            return nodes[choices[cls]]
        except KeyError:
            raise EncodeError(f"the extraction chose nothing for e-class {cls}") from None

    def tensor_children(n: dict[str, Any], arity: int | None) -> list[str]:
        if arity is None:  # one Vec[Tensor] child listing the inputs
            vec = node_of(nodes[n["children"][0]]["eclass"])
            return [nodes[c]["eclass"] for c in vec["children"]]
        return [nodes[c]["eclass"] for c in n["children"][:arity]]

    for root in roots:
        stack: list[tuple[str, bool]] = [(root, False)]
        while stack:
            cls, ready = stack.pop()
            if cls in built:
                continue
            n = node_of(cls)
            opdef = get_op(n["op"])
            kids = tensor_children(n, opdef.arity)
            if not ready:
                stack.append((cls, True))
                stack.extend((k, False) for k in kids if k not in built)
                continue
            # a literal's e-class holds that literal alone, so its node is the choice
            attrs = node_attrs(view, n)
            built[cls] = _append(out, opdef.name, [built[k] for k in kids], attrs,
                                 class_types.get(cls), by_key, inputs_by_name)
    return out, [built[r] for r in roots]


def _append(g: Graph, op: str, inputs: list[int], attrs: dict[str, Any],
            known: ValueType | None, by_key: dict[int, Any], inputs_by_name: dict) -> int:
    if op == "fallback":  # the captured call, with its inputs renumbered
        original = by_key[attrs["key"]]
        return g.append(op, tuple(inputs), dict(original.attrs), original.type)
    if op == "input":
        original = inputs_by_name[attrs["name"]]
        return g.append(op, (), dict(original.attrs), original.type)
    if op in ("param", "const"):
        t = g.constants[attrs["name"]]
        return g.append(op, (), attrs, TensorType(tuple(t.shape), str(t.dtype)[6:]))
    opdef = get_op(op)
    if known is not None and (opdef.reference is None or opdef.shape_rule == "given"):
        return g.append(op, tuple(inputs), attrs, known)
    node_id = g.add(op, inputs, **attrs)
    inferred = g.node(node_id).type
    if known is not None and inferred != known:
        raise EncodeError(f"decoded {op} has type {inferred} but its e-class holds {known}: "
                          "a rewrite rule changed a type")
    return node_id
