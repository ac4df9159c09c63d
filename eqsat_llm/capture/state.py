"""State written in place: a model's write into its own buffer (a static KV cache's
`index_copy_`, `buf[idx] = x`) runs in place on the module's buffer, instead of building a
whole new buffer and copying it back after the call.

torch.export functionalizes such a write into an op that returns a new buffer (`index_put`,
`index_copy`) and lists the result as a mutation. When that op reads the buffer's run-time
input and nothing else reads the old value, running its in-place variant on the buffer itself
gives the same result: the op's value is then the buffer (a view of the input, no storage of
its own), and the write-back after the call has nothing left to copy. A pass from graph to
graph over the optimized program, before planning."""

from __future__ import annotations

import torch

from ..ir import Graph
from .converter import Captured, Slot

aten = torch.ops.aten

IN_PLACE = {aten.index_put.default: aten.index_put_.default,
            aten.index_copy.default: aten.index_copy_.default}


def write_state_in_place(graph: Graph, captured: Captured) -> list[int]:
    """Turn each eligible state write of `graph` (outputs `captured.mutations`) into its
    in-place variant (fallback attrs `fn`, `target`, `inplace`); returns their positions."""
    names = list(captured.state)
    n_user = len(graph.input_ids) - len(names)
    by_index = {n.attrs["index"]: n.id for n in graph.nodes if n.op == "input"}
    live, users = graph.live_ids(), graph.users()
    done = []
    for k, (kind, target) in enumerate(captured.mutations):
        if kind != "state":
            continue
        write = graph.node(graph.outputs[k])
        state = by_index.get(n_user + names.index(target))
        fn = write.attrs.get("fn") if write.op == "fallback" else None
        if (fn not in IN_PLACE or state is None or write.inputs[:1] != (state,)
                or write.attrs["template"][0][:1] != (Slot(0),)
                or [u for u in users[state] if u in live] != [write.id]
                or not captured.state[target].is_contiguous()):
            continue  # another reader needs the old value: a new buffer, copied back
        write.attrs = {**write.attrs, "fn": IN_PLACE[fn], "target": str(IN_PLACE[fn]),
                       "inplace": True}
        done.append(k)
    return done
