"""Elementwise-chain fusion: a tree of elementwise nodes whose intermediate values each have
exactly one consumer (inside the tree), are not graph outputs and have the root's shape becomes
one kernel: one loop nest over the root's output, every intermediate a register (a local
variable of the loop body, in its own dtype, as if stored and loaded), never written to memory.

The memory plan is not changed: it still reserves the intermediates' buffers (never written)
and may give an input of an inner node's bytes to a later node, since the plan thinks that
input dead after the inner node. So a group is cut (the inner node becomes a root of its own)
when a kernel scheduled between the inner node and the root writes bytes of one of the inner
node's inputs, or when the root's output overlaps such an input other than element for
element (an in-place chain: each element is read before it is written)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...ir import Graph, dtype_of
from ...plan import ARENA, OUTPUT, MemoryPlan
from .emit_elementwise import ELEMENTWISE_OPS, element_expr
from .loops import broadcast_strides, loop_nest
from .values import Ref, build_layout


@dataclass(frozen=True)
class Group:
    root: int
    members: tuple[int, ...]  # in plan order, the root last
    inputs: tuple[int, ...]  # the tensors read from memory (not scalars), in first-use order


def _span(r: Ref) -> tuple[int, int]:
    """The bytes [lo, hi) a view into the arena can touch."""
    size = _itemsize(r.dtype)
    if any(n == 0 for n in r.shape):
        return (0, 0)
    lo = r.offset + sum(min(0, (n - 1) * s) for n, s in zip(r.shape, r.strides))
    hi = r.offset + sum(max(0, (n - 1) * s) for n, s in zip(r.shape, r.strides)) + 1
    return r.slot + lo * size, r.slot + hi * size


def _itemsize(dtype: str) -> int:
    return dtype_of(dtype).itemsize


def overlaps(a: Ref, b: Ref) -> bool:
    if a.space == "scalar" or b.space == "scalar" or a.space != b.space:
        return False
    if a.space != "A":
        return a.slot == b.slot
    (alo, ahi), (blo, bhi) = _span(a), _span(b)
    return alo < bhi and blo < ahi


def same_elements(out: Ref, x: Ref) -> bool:
    """x, broadcast to out's shape, is read at exactly the addresses out is written."""
    if out.space != x.space or out.slot != x.slot or out.offset != x.offset \
            or _itemsize(out.dtype) != _itemsize(x.dtype):
        return False
    bs = broadcast_strides(out.shape, x.shape, x.strides)
    return all(n == 1 or s == t for n, s, t in zip(out.shape, out.strides, bs))


def fusion_groups(graph: Graph, plan: MemoryPlan, refs: dict[int, Ref] | None = None,
                  generated: Callable[[int], bool] | None = None) -> list[Group]:
    """The groups of two or more nodes, in the plan's order of their roots. `generated(nid)`:
    whether the backend computes the node as an element expression (default: the C one)."""
    if refs is None:
        refs = build_layout(graph, plan).refs
    pos = {nid: k for k, nid in enumerate(plan.order)}
    outputs = set(graph.outputs)
    users: dict[int, set[int]] = {nid: set() for nid in plan.order}
    for nid in plan.order:
        for i in graph.node(nid).inputs:
            if i in users:
                users[i].add(nid)

    def fusable(nid: int) -> bool:
        node = graph.node(nid)
        if plan.kinds.get(nid) not in (ARENA, OUTPUT):
            return False
        if generated is not None:
            return generated(nid)
        if node.op not in ELEMENTWISE_OPS:
            return False
        if nid not in refs or any(i not in refs or not refs[i].in_c for i in node.inputs) \
                or not refs[nid].in_c:  # a torch step's value (emit.py)
            return False
        return element_expr(node, refs[nid], [refs[i] for i in node.inputs]) is not None

    ok = {nid for nid in plan.order if fusable(nid)}
    # parent[p] = c: p is computed inside c's kernel
    parent: dict[int, int] = {}
    for p in plan.order:
        if p not in ok or plan.kinds[p] != ARENA or p in outputs or len(users[p]) != 1:
            continue
        (c,) = users[p]
        if c in ok and refs[p].shape == refs[c].shape and pos[p] < pos[c]:
            parent[p] = c

    while True:
        groups = _collect(graph, plan, parent, refs)
        bad = _first_unsafe(graph, plan, parent, refs, pos, groups)
        if bad is None:
            return [g for g in groups if len(g.members) > 1]
        del parent[bad]


def _collect(graph: Graph, plan: MemoryPlan, parent: dict[int, int],
             refs: dict[int, Ref]) -> list[Group]:
    def root_of(n: int) -> int:
        while n in parent:
            n = parent[n]
        return n

    members: dict[int, list[int]] = {}
    for nid in plan.order:
        if nid in parent:
            members.setdefault(root_of(nid), []).append(nid)
    groups = []
    for nid in plan.order:
        if nid not in members:
            continue
        ms = members[nid] + [nid]
        inside = set(ms)
        ins: list[int] = []
        for m in ms:
            for i in graph.node(m).inputs:
                if i not in inside and refs[i].space != "scalar" and i not in ins:
                    ins.append(i)
        groups.append(Group(nid, tuple(ms), tuple(ins)))
    return groups


def _first_unsafe(graph: Graph, plan: MemoryPlan, parent: dict[int, int],
                  refs: dict[int, Ref], pos: dict[int, int], groups: list[Group]) -> int | None:
    """An inner node whose inputs may be overwritten before its root's kernel runs."""
    for g in groups:
        out = refs[g.root]
        inside = set(g.members)
        for m in g.members[:-1]:
            for i in graph.node(m).inputs:
                x = refs[i]
                if i in inside or x.space == "scalar":
                    continue
                if overlaps(out, x) and not same_elements(out, x):
                    return m
                for w in plan.order[pos[m] + 1:pos[g.root]]:
                    if (plan.kinds[w] in (ARENA, OUTPUT) and w not in parent and w in refs
                            and overlaps(refs[w], x)):
                        return m
    return None


def emit_fused(graph: Graph, group: Group, refs: dict[int, Ref], restrict: bool) -> str | None:
    """The group's kernel: the root's loop nest, each inner node a local variable."""
    out = refs[group.root]
    inside = set(group.members)
    tensors = [refs[i] for i in group.inputs]
    strides = [out.strides] + [broadcast_strides(out.shape, r.shape, r.strides) for r in tensors]
    exprs = []
    for m in group.members:
        node = graph.node(m)
        e = element_expr(node, refs[m], [refs[i] for i in node.inputs])
        if e is None:
            return None
        exprs.append((m, node, e))
    decl = [f"/* fused: {', '.join(f'%{m} {node.op}' for m, node, _ in exprs)} */",
            f"{out.ctype}* {'restrict ' if restrict else ''}o = {out.ptr(const=False)};"]
    decl += [f"const {r.ctype}* x{k} = {r.ptr()};" for k, r in enumerate(tensors)]

    def body(offs: list[str]) -> str:
        lines = []
        for m, node, (ct, expr) in exprs:
            args = []
            for i in node.inputs:
                r = refs[i]
                if i in inside:
                    args.append(f"(({ct})v{i})")
                elif r.space == "scalar":
                    args.append(r.literal(ct))
                else:
                    k = group.inputs.index(i)
                    args.append(f"(({ct})x{k}[{offs[k + 1]}])")
            t = refs[m].ctype
            if m == group.root:
                lines.append(f"    o[{offs[0]}] = ({t}){expr(args)};")
            else:
                lines.append(f"    const {t} v{m} = ({t}){expr(args)};")
        return "\n".join(lines)

    return "\n".join(decl) + "\n" + loop_nest(out.shape, strides, body)
