"""The e-graph as extraction reads it: the egraph-serialize JSON format (the one egglog
serializes to and the extraction-gym benchmark uses), loaded into `EGraph` and checked, each
malformed input an `EGraphFormatError` naming the culprit."""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EqsatError

__all__ = ["EGraph", "EGraphFormatError", "ENode", "load_egraph"]


class EGraphFormatError(EqsatError, ValueError):
    """The input is not a well-formed egraph-serialize e-graph (message names the culprit)."""


@dataclass(slots=True)
class ENode:
    """One e-node. ``children`` are child *class* ids (resolved from child node ids at load
    time, since extraction reasons about classes); duplicates are kept, e.g. ``x * x``."""

    id: str
    op: str
    children: tuple[str, ...]
    eclass: str
    cost: float = 1.0
    subsumed: bool = False  # subsumed nodes are kept (for inspection) but never chosen


@dataclass(slots=True)
class EGraph:
    """An e-graph: nodes by id, classes as node-id lists, root classes, opaque class data."""

    nodes: dict[str, ENode]
    classes: dict[str, list[str]]
    roots: list[str] = field(default_factory=list)
    class_data: dict[str, Any] = field(default_factory=dict)


def load_egraph(source: str | os.PathLike[str] | Mapping[str, Any]) -> EGraph:
    """Load and validate an egraph-serialize e-graph from a JSON file path or a parsed dict.

    Validation is strict (every problem raises :class:`EGraphFormatError` naming the file,
    node, key or value) so that bad serializer output fails here, not as a confusing
    extraction error later. A missing file raises the usual :class:`OSError`.
    """
    if isinstance(source, Mapping):
        return _parse(source, "<dict>")
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        raw = path.read_bytes()
        try:
            data = json.loads(raw)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise EGraphFormatError(f"{path}: not valid JSON: {exc}") from exc
        return _parse(data, str(path))
    raise TypeError(f"load_egraph: expected a path or a dict, got {type(source).__name__}")


def _as_id(value: Any, where: str, what: str) -> str:
    # egraph-serialize ids are strings; ints are accepted for hand-built dicts.
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise EGraphFormatError(f"{where}: {what} must be a string id, got {value!r}")


def _check_cost(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise EGraphFormatError(f"{where}: cost must be a number, got {value!r}")
    cost = float(value)
    if math.isnan(cost) or math.isinf(cost) or cost < 0:
        raise EGraphFormatError(f"{where}: cost must be finite and non-negative, got {value!r}")
    return cost


def _parse(data: Any, src: str) -> EGraph:
    if not isinstance(data, Mapping):
        raise EGraphFormatError(
            f"{src}: top level must be a JSON object, got {type(data).__name__}"
        )
    if "nodes" not in data:
        raise EGraphFormatError(f"{src}: missing key 'nodes'")
    raw_nodes = data["nodes"]
    if not isinstance(raw_nodes, Mapping):
        raise EGraphFormatError(f"{src}: 'nodes' must be an object mapping node id -> node")

    # First pass: per-node fields; children stay node ids until every node is known.
    staged: list[tuple[str, str, list[str], str, float, bool]] = []
    node_class: dict[str, str] = {}
    for key, raw in raw_nodes.items():
        nid = _as_id(key, src, "node id")
        where = f"{src}: node {nid!r}"
        if not isinstance(raw, Mapping):
            raise EGraphFormatError(f"{where}: must be an object, got {type(raw).__name__}")
        for required in ("op", "eclass"):
            if required not in raw:
                raise EGraphFormatError(f"{where}: missing key {required!r}")
        op = raw["op"]
        if not isinstance(op, str):
            raise EGraphFormatError(f"{where}: 'op' must be a string, got {op!r}")
        eclass = _as_id(raw["eclass"], where, "'eclass'")
        kids = raw.get("children", [])
        if not isinstance(kids, list):
            raise EGraphFormatError(f"{where}: 'children' must be a list, got {kids!r}")
        kids = [_as_id(k, where, "child") for k in kids]
        cost = _check_cost(raw["cost"], where) if "cost" in raw else 1.0
        subsumed = raw.get("subsumed", False)
        if not isinstance(subsumed, bool):
            raise EGraphFormatError(f"{where}: 'subsumed' must be a boolean, got {subsumed!r}")
        if nid in node_class:
            raise EGraphFormatError(f"{where}: duplicate node id")
        node_class[nid] = eclass
        staged.append((nid, op, kids, eclass, cost, subsumed))

    nodes: dict[str, ENode] = {}
    classes: dict[str, list[str]] = {}
    for nid, op, kids, eclass, cost, subsumed in staged:
        try:
            child_classes = tuple(node_class[k] for k in kids)
        except KeyError as exc:
            raise EGraphFormatError(
                f"{src}: node {nid!r}: child {exc.args[0]!r} names no node"
            ) from None
        nodes[nid] = ENode(nid, op, child_classes, eclass, cost, subsumed)
        classes.setdefault(eclass, []).append(nid)

    raw_roots = data.get("root_eclasses", [])
    if not isinstance(raw_roots, list):
        raise EGraphFormatError(f"{src}: 'root_eclasses' must be a list, got {raw_roots!r}")
    roots = [_as_id(r, src, "root eclass") for r in raw_roots]
    for r in roots:
        if r not in classes:
            raise EGraphFormatError(f"{src}: root eclass {r!r} names no class (no node has it)")

    class_data = data.get("class_data") or {}
    if not isinstance(class_data, Mapping):
        raise EGraphFormatError(f"{src}: 'class_data' must be an object")
    return EGraph(nodes, classes, roots, dict(class_data))
