"""The reference runtime: executes an IR graph node by node with the ops' reference semantics.

It is the ground truth the other backends are tested against, and the backend of record until
a compiled one replaces it. Values are dropped after their last use so that peak memory stays
close to that of the program itself.
"""

from __future__ import annotations

from typing import Any

import torch

from ..capture.converter import run_fallback
from ..errors import GraphError
from ..ir import Graph
from ..ops import evaluate


class ReferenceRuntime:
    def __init__(self, graph: Graph):
        self.graph = graph
        live = graph.live_ids()
        self.order = [n for n in graph.nodes if n.id in live]
        # last_use[i]: the position in `order` after which value i is no longer needed
        last_use: dict[int, int] = {}
        for pos, node in enumerate(self.order):
            for i in node.inputs:
                last_use[i] = pos
        outputs = set(graph.outputs)
        self.free_after: list[list[int]] = [[] for _ in self.order]
        for i, pos in last_use.items():
            if i not in outputs:
                self.free_after[pos].append(i)
        # inputs are bound by index; ones the program no longer reads may be missing from it
        self.n_inputs = 1 + max((n.attrs["index"] for n in self.order if n.op == "input"),
                                default=-1)

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if len(inputs) < self.n_inputs:
            raise GraphError(f"the program reads {self.n_inputs} inputs, got {len(inputs)}")
        values: dict[int, Any] = {}
        constants = self.graph.constants
        for pos, node in enumerate(self.order):
            if node.op == "input":
                values[node.id] = inputs[node.attrs["index"]]
            elif node.op in ("param", "const"):
                values[node.id] = constants[node.attrs["name"]]
            else:
                xs = [values[i] for i in node.inputs]
                if node.op == "fallback":
                    values[node.id] = run_fallback(node.attrs, xs)
                else:
                    values[node.id] = evaluate(node.op, xs, node.attrs)
            for i in self.free_after[pos]:
                del values[i]
        return [values[i] for i in self.graph.outputs]
