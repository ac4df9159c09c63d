"""Per-kernel figures of a compiled program: shapes, the cost model's prediction and, when
asked, the measured time of each kernel (its reference semantics run alone, median of
repeats, on the example inputs' intermediate values)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from .codegen import ReferenceRuntime
from .frontend import run_fallback
from .ir import VALUE_LEAVES, Graph, TensorType
from .ops import evaluate


def kernel_table(graph: Graph, model: Any = None, inputs: list[torch.Tensor] | None = None,
                 repeats: int = 20) -> list[dict[str, Any]]:
    """One row per kernel of the program; `measured_s` when inputs are given; `flops`,
    `bytes` and `predicted_s` when a cost model is given (CostModel.kernel)."""
    values = ReferenceRuntime(graph).run_all(inputs) if inputs is not None else {}
    rows = []
    live = graph.live_ids()
    for node in graph.nodes:
        if node.id not in live or node.op in VALUE_LEAVES:
            continue
        ins = [graph.node(i).type for i in node.inputs]
        row: dict[str, Any] = {
            "id": node.id, "op": node.op,
            "inputs": ", ".join(str(t) for t in ins), "output": str(node.type)}
        if model is not None and isinstance(node.type, TensorType) and all(
                isinstance(t, TensorType) for t in ins):
            k = model.kernel(node.op, node.attrs, ins, node.type)
            row.update(flops=k.flops, bytes=k.bytes_read + k.bytes_written,
                       predicted_s=k.seconds)
        if values:
            xs = [values[i] for i in node.inputs]
            row["measured_s"] = _time(node.op, node.attrs, xs, repeats)
        rows.append(row)
    return rows


def _time(op: str, attrs: dict[str, Any], xs: list[Any], repeats: int) -> float:
    def run() -> Any:
        return run_fallback(attrs, xs) if op == "fallback" else evaluate(op, xs, attrs)

    with torch.no_grad():
        run()
        samples = []
        for _ in range(repeats):
            t = time.perf_counter()
            run()
            samples.append(time.perf_counter() - t)
    return statistics.median(samples)
