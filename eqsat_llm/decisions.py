"""Why this program: one entry per kernel of the extracted program, for the report.

Each entry names the kernel (op, input and output types), its predicted cost under the model
extraction used, the rules that built it (recorded when they fired: provenance.py), and the
alternatives its e-class held, each with the change of the whole program's predicted cost had
it been chosen (`alternatives.py`). The entries are plain dicts: the report's JSON `kernels`.
"""

from __future__ import annotations

from typing import Any

from .ir import VALUE_LEAVES, Graph, TensorType, node_label


def kernel_entries(graph: Graph, model: Any, eclass_of: dict[int, str]) -> list[dict[str, Any]]:
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
        entry: dict[str, Any] = {
            "id": n.id, "op": n.op, "label": node_label(n),
            "inputs": [str(t) for t in ins], "output": str(n.type),
            "eclass": eclass_of.get(n.id), "consumers": consumers.get(n.id, 0),
            "predicted_us": None, "flops": None, "bytes": None, "bound": None,
            "group": None, "measured_us": None, "rules": [], "alternatives": []}
        if model is not None and isinstance(n.type, TensorType) and all(
                isinstance(t, TensorType) for t in ins):
            k = model.kernel(n.op, n.attrs, ins, n.type)
            entry.update(predicted_us=k.micros, flops=k.flops,
                         bytes=k.bytes_read + k.bytes_written, bound=k.bound)
        entries.append(entry)
    return entries
