"""The typed graph IR: the one program representation that every phase reads and writes.

A `Graph` is a list of `Node`s in topological order. Each node names an op of the registry
(`eqsat_llm.ops`), its tensor inputs (ids of earlier nodes), its attributes (plain Python
values: ints, floats, strings, tuples) and its inferred `TensorType`. Graph inputs, weights and
constants are leaf nodes (`input`, `param`, `const`); the tensors behind `param`/`const` live
in `Graph.constants`, apart from the program.

The IR depends on the registry (a node's type is inferred by its op's rule); the registry and
the weight formats never import the IR: they read `tensor_type.py`, re-exported here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import GraphError
from .ops import gemm_label, get_op
from .tensor_type import TensorType, ValueType, dtype_name, dtype_of

__all__ = [
    "VALUE_LEAVES",
    "Graph",
    "Node",
    "TensorType",
    "ValueType",
    "contiguous_strides",
    "dtype_name",
    "dtype_of",
    "node_label",
]


# Ops that compute nothing at run time: bound inputs, weights, constants, Python numbers.
VALUE_LEAVES = frozenset({"input", "param", "const", "scalar"})


@dataclass
class Node:
    id: int
    op: str
    inputs: tuple[int, ...]
    attrs: dict[str, Any]
    type: ValueType

    def __str__(self) -> str:
        args = ", ".join(f"%{i}" for i in self.inputs)
        attrs = ", ".join(f"{k}={v!r}" for k, v in self.attrs.items() if k != "fn")
        sep = ", " if args and attrs else ""
        return f"%{self.id} = {self.op}({args}{sep}{attrs}) : {self.type}"


@dataclass
class Graph:
    """A program: nodes in topological order, the ids of its outputs, and its constants."""

    nodes: list[Node] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    _by_id: dict[int, Node] = field(default_factory=dict, repr=False)

    def add(self, op: str, inputs: tuple[int, ...] | list[int] = (), **attrs: Any) -> int:
        """Append a node, inferring its type with the op's registered rule. Returns its id."""
        inputs = tuple(inputs)
        for i in inputs:
            if i not in self._by_id:
                raise GraphError(f"{op}: input %{i} is not an earlier node of the graph")
        opdef = get_op(op)
        node_type = opdef.infer_type([self._by_id[i].type for i in inputs], attrs)
        return self.append(op, inputs, attrs, node_type)

    def append(self, op: str, inputs: tuple[int, ...], attrs: dict[str, Any],
               node_type: ValueType) -> int:
        """Append a node whose type is already known (used by decoders and the frontend)."""
        node = Node(len(self.nodes), op, tuple(inputs), dict(attrs), node_type)
        self.nodes.append(node)
        self._by_id[node.id] = node
        return node.id

    def node(self, node_id: int) -> Node:
        return self._by_id[node_id]

    def type_of(self, node_id: int) -> TensorType:
        t = self._by_id[node_id].type
        if not isinstance(t, TensorType):
            raise GraphError(f"%{node_id} is a tuple; take an element with getitem")
        return t

    @property
    def input_ids(self) -> list[int]:
        """User inputs in call order (the `index` attribute of each `input` node)."""
        ins = [n for n in self.nodes if n.op == "input"]
        return [n.id for n in sorted(ins, key=lambda n: n.attrs["index"])]

    def op_counts(self, include_leaves: bool = False) -> Counter[str]:
        """Live nodes by label (node_label: a gemm counted by its descriptor)."""
        live = self.live_ids()
        return Counter(node_label(n) for n in self.nodes
                       if n.id in live and (include_leaves or n.op not in VALUE_LEAVES))

    def live_ids(self) -> set[int]:
        """Ids of the nodes the outputs depend on (iteratively: graphs are deep)."""
        live: set[int] = set()
        stack = list(self.outputs)
        while stack:
            i = stack.pop()
            if i in live:
                continue
            live.add(i)
            stack.extend(self._by_id[i].inputs)
        return live

    def users(self) -> dict[int, list[int]]:
        users: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                users[i].append(n.id)
        return users

    def __str__(self) -> str:
        lines = [str(n) for n in self.nodes]
        lines.append("return " + ", ".join(f"%{i}" for i in self.outputs))
        return "\n".join(lines)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major element strides of a dense tensor of this shape."""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def node_label(node: Node) -> str:
    """What reports and counts call a node: its op, and for the gemm op its descriptor's
    label (ops/gemm.py gemm_label: gemm[rms_norm], gemm[int8+add], ...)."""
    return gemm_label(node.attrs) if node.op == "gemm" else node.op
