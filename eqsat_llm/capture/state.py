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
        dim = rows_written(fn, write.attrs["template"])
        if dim is not None:
            write.attrs["rows_at"] = dim
        done.append(k)
    return done


def rows_written(fn: object, template: tuple) -> int | None:
    """The dim d when the write is `state[..., pos, ...] = values` along d, its inputs state,
    pos (1-D) and values in that order: `index_put(state, [None] * d + [pos], values)` without
    accumulate, or `index_copy(state, d, pos, values)` (the C backend writes such rows itself,
    codegen/c/emit_gather.py); else None."""
    args, kwargs = template
    if kwargs:
        return None
    if fn is aten.index_put.default and len(args) in (3, 4) and args[0] == Slot(0) and \
            args[2] == Slot(2) and (len(args) == 3 or args[3] is False):
        index = args[1]
        if isinstance(index, (list, tuple)) and index and index[-1] == Slot(1) and \
                all(i is None for i in index[:-1]):
            return len(index) - 1
    if fn is aten.index_copy.default and len(args) == 4 and isinstance(args[1], int) and \
            args[0] == Slot(0) and args[2] == Slot(1) and args[3] == Slot(2):
        return args[1]
    return None
