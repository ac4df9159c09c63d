"""Static memory planning: one schedule, one arena, every intermediate at a fixed offset.

`plan_memory(graph)` decides, once per program:

1. **Storage kinds** (order independent). Every live node is run on meta tensors that carry the
   exact strides the runtime will give it, so torch itself says which layout op returns a view
   (`view` is `torch.reshape`: a view only when the strides allow it) and which strides each
   op's result has. A view of an arena buffer is an `alias` (no bytes of its own); any other
   computed value owns an arena buffer laid out with the strides the reference op would give it
   (so out= kernels see the same layouts as the reference runtime). Graph inputs, params,
   consts, outputs and Python values live outside the arena.
2. **A schedule**: the program order, a greedy memory-aware order and a depth-first order are
   each planned, and the one with the lowest peak is kept.
3. **Liveness** on that schedule; a buffer lives until the last use of any of its views, and an
   elementwise op may write over an input buffer that dies at that op (in-place reuse).
4. **Offsets**: greedy by size with best fit, 64-byte aligned.

`check_plan` re-derives what must hold from the graph and the plan's numbers alone.
See docs/memory.md.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .errors import EqsatError
from .ir import Graph, Node, TensorType, contiguous_strides, dtype_of
from .ops import LEAF_OPS, REGISTRY, WEAK_DTYPES, evaluate, get_op, ops_where

ALIGN = 64

# IR ops that may return a view of their input (their registry entries say so); whether one
# does is decided per node by torch.
VIEW_OPS = frozenset(name for name, d in REGISTRY.items() if d.may_view)

# Storage kinds of a live node.
LEAF = "leaf"            # input / param / const: bound at call time, outside the arena
SCALAR = "scalar"        # a Python number
ARENA = "arena"          # owns an arena buffer; its op writes into it
ALIAS = "alias"          # a view of an arena buffer
OUTPUT = "output"        # a fresh tensor per call, returned to the caller (or viewed by an output)
COPY_OUT = "copy_out"    # an output that is a view of an arena buffer: copied out per call
EXTERN_VIEW = "extern_view"  # a view of a leaf or of an output: no storage of its own
TEMP = "temp"            # a value torch allocates (tuple-valued fallbacks): outside the arena


class PlanError(EqsatError):
    """A memory plan is inconsistent with its graph (overlap, misalignment, bad order...)."""


@dataclass(frozen=True)
class Buffer:
    """Bytes [offset, offset + nbytes) of the arena, in use from schedule step `start` to step
    `end` inclusive. An alias (a view) records the bytes it spans inside its base `alias_of`;
    an in-place result records the buffer it overwrites, `inplace_of`."""

    node_id: int
    offset: int
    nbytes: int
    start: int
    end: int
    alias_of: int | None = None
    inplace_of: int | None = None


@dataclass
class MemoryPlan:
    order: list[int]
    buffers: dict[int, Buffer]
    arena_bytes: int
    lower_bound_bytes: int
    naive_bytes: int
    kinds: dict[int, str] = field(default_factory=dict)
    # element strides of every arena buffer and per-call output (the reference op's layout)
    strides: dict[int, tuple[int, ...]] = field(default_factory=dict)
    schedule: str = "program"  # which candidate order was kept

    @property
    def inplace_count(self) -> int:
        return sum(b.inplace_of is not None for b in self.buffers.values())

    @property
    def alias_count(self) -> int:
        return sum(b.alias_of is not None for b in self.buffers.values())

    def summary(self) -> str:
        return (f"arena {self.arena_bytes} B, lower bound {self.lower_bound_bytes} B, "
                f"naive {self.naive_bytes} B; {len(self.buffers) - self.alias_count} buffers "
                f"({self.inplace_count} in place), {self.alias_count} views; "
                f"schedule {self.schedule}")


def _round_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


def tensor_bytes(t: TensorType) -> int:
    return t.numel * dtype_of(t.dtype).itemsize


def is_tensor(t: Any) -> bool:
    return isinstance(t, TensorType) and t.dtype not in WEAK_DTYPES


# --- 1. storage kinds and layouts ------------------------------------------------------------
@dataclass
class Layout:
    """Order-independent facts: each live node's kind, its storage root, its meta tensor (the
    runtime's exact strides and storage offset, relative to its root) and the buffer size."""

    kinds: dict[int, str]
    root: dict[int, int]  # node -> node owning its storage (itself for buffers and outputs)
    meta: dict[int, torch.Tensor]
    nbytes: dict[int, int]  # arena buffers: aligned size
    strides: dict[int, tuple[int, ...]]


def _dense_strides(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: the strides are a permutation of a contiguous layout."""
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1)
    expected = 1
    for s, n in dims:
        if s != expected:
            return False
        expected *= n
    return True


def _base(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._base is not None else t


def _reference_strides(node: Node, xs: list[Any], t: TensorType) -> tuple[int, ...]:
    """The strides the reference op gives its result, when they describe a dense layout;
    contiguous otherwise (a buffer is always dense and starts at its offset)."""
    if node.op not in ("fallback", "getitem") and all(x is not None for x in xs):
        try:
            out = evaluate(node.op, xs, node.attrs)
        except (RuntimeError, NotImplementedError, TypeError, ValueError, IndexError):
            # data-dependent or meta-less ops: contiguous is always valid
            out = None
        if (isinstance(out, torch.Tensor) and tuple(out.shape) == t.shape
                and _dense_strides(out)):
            return tuple(out.stride())
    return contiguous_strides(t.shape)


# ops that write any output strides on every runtime (a strided kernel in C, computed then
# copied in by the planned runtime): their buffers may take the layout their user wants
STRIDE_FREE_OPS = ops_where("stride_free")  # (ops/registry.py: OpDef.stride_free)


def _head_merge_strides(graph: Graph, live: set[int]) -> dict[int, tuple[int, ...]]:
    """Strides for a STRIDE_FREE_OPS buffer whose only use is a permute or transpose (the
    attention heads merged back, `out.transpose(1, 2).reshape(b, s, h * d)`): laid out so that
    the permuted value is contiguous, and the reshape after it a free view instead of a copy."""
    users = graph.users()
    chosen: dict[int, tuple[int, ...]] = {}
    for node in graph.nodes:
        if node.id not in live or node.op not in ("permute", "transpose"):
            continue
        src = graph.node(node.inputs[0])
        if (src.op not in STRIDE_FREE_OPS or src.id in graph.outputs
                or [u for u in users[src.id] if u in live] != [node.id]):
            continue
        rank = len(node.type.shape)
        if node.op == "permute":
            dims = [d % rank for d in node.attrs["dims"]]
        else:
            dims = list(range(rank))
            a, b = node.attrs["dim0"] % rank, node.attrs["dim1"] % rank
            dims[a], dims[b] = dims[b], dims[a]
        st = [0] * rank
        for i, c in zip(dims, contiguous_strides(node.type.shape)):
            st[i] = c  # permuted[j] = src[dims[j]]: src's dim dims[j] gets stride c_j
        chosen[src.id] = tuple(st)
    return chosen


def analyse_layout(graph: Graph) -> Layout:
    live = graph.live_ids()
    preferred = _head_merge_strides(graph, live)
    outputs = set(graph.outputs)
    kinds: dict[int, str] = {}
    root: dict[int, int] = {}
    meta: dict[int, Any] = {}
    nbytes: dict[int, int] = {}
    strides: dict[int, tuple[int, ...]] = {}
    for node in graph.nodes:
        nid = node.id
        if nid not in live:
            continue
        t = node.type
        if node.op == "scalar":
            kinds[nid], meta[nid] = SCALAR, evaluate("scalar", [], node.attrs)
            continue
        if node.op in LEAF_OPS:
            kinds[nid], root[nid] = LEAF, nid
            meta[nid] = _leaf_meta(graph, node)
            continue
        if not is_tensor(t):
            kinds[nid], meta[nid] = TEMP, None
            continue
        assert isinstance(t, TensorType)
        xs = [meta.get(i) for i in node.inputs]
        if node.op in VIEW_OPS and isinstance(xs[0], torch.Tensor):
            out = evaluate(node.op, xs, node.attrs)
            if _base(out) is _base(xs[0]):  # torch made a view: share the input's storage
                base = root[node.inputs[0]]
                meta[nid], root[nid] = out, base
                if kinds[base] == ARENA:
                    kinds[nid] = COPY_OUT if nid in outputs else ALIAS
                else:
                    kinds[nid] = EXTERN_VIEW
                continue
        if node.attrs.get("inplace"):  # a state write run in place (capture/state.py): its value
            base = root[node.inputs[0]]  # is the state input itself
            meta[nid], root[nid], kinds[nid] = xs[0], base, EXTERN_VIEW
            continue
        st = preferred.get(nid) or _reference_strides(node, xs, t)
        kinds[nid] = OUTPUT if nid in outputs else ARENA
        root[nid], strides[nid] = nid, st
        meta[nid] = torch.empty_strided(t.shape, st, dtype=dtype_of(t.dtype), device="meta")
        if kinds[nid] == ARENA:
            nbytes[nid] = _round_up(tensor_bytes(t))
    _promote_viewed_outputs(kinds, root, meta, nbytes)
    return Layout(kinds, root, meta, nbytes, strides)


def _promote_viewed_outputs(kinds: dict[int, str], root: dict[int, int],
                            meta: dict[int, Any], nbytes: dict[int, int]) -> None:
    """An output that views all of an arena buffer (`view(mm(...))`, a permute) would cost
    the buffer in the arena plus a copy per call: the buffer is allocated per call instead and
    the output stays a view of it, as the reference returns it. An output that views part of a
    buffer (a slice, a select) is copied out, so the caller does not keep the whole buffer."""
    whole = set()
    for nid, kind in kinds.items():
        if kind == COPY_OUT:
            r = root[nid]
            if _span(meta[nid]) == (0, meta[r].numel() * meta[r].element_size()):
                whole.add(r)
    for nid in list(kinds):
        if root.get(nid) in whole:
            kinds[nid] = OUTPUT if nid == root[nid] else EXTERN_VIEW
            nbytes.pop(nid, None)


def _leaf_meta(graph: Graph, node: Node) -> torch.Tensor:
    t = node.type
    assert isinstance(t, TensorType)
    c = graph.constants.get(node.attrs.get("name", "")) if node.op != "input" else None
    st = tuple(c.stride()) if isinstance(c, torch.Tensor) else contiguous_strides(t.shape)
    # inputs are assumed contiguous (docs/memory.md); params and consts have their own strides
    return torch.empty_strided(t.shape, st, dtype=dtype_of(t.dtype), device="meta")


# --- 2. schedules ------------------------------------------------------------------------------
def _program_order(graph: Graph, live: set[int]) -> list[int]:
    return [n.id for n in graph.nodes if n.id in live]


def _dfs_order(graph: Graph, live: set[int]) -> list[int]:
    """Depth-first post-order from the outputs: each value is computed just before its first
    consumer needs it, so input-independent subgraphs (masks, rotary tables) come late."""
    order: list[int] = []
    done: set[int] = set()

    def visit(nid: int) -> None:
        done.add(nid)
        order.append(nid)

    for out in graph.outputs:
        _post_order(graph, out, done, visit)
    return order


def _post_order(graph: Graph, start: int, done: set[int], visit: Callable[[int], None]) -> None:
    """Visit `start` and its ancestors not in `done` in depth-first post-order (iteratively:
    graphs are thousands of nodes deep); `visit` must add the node to `done`."""
    stack = [(start, 0)]
    while stack:
        nid, k = stack.pop()
        if nid in done:
            continue
        inputs = graph.node(nid).inputs
        if k < len(inputs):
            stack.append((nid, k + 1))
            if inputs[k] not in done:
                stack.append((inputs[k], 0))
        else:
            visit(nid)


def _greedy_order(graph: Graph, live: set[int], lay: Layout) -> list[int]:
    """List scheduling on the program order: a ready node that frees more bytes than it
    allocates is taken first (the largest net gain first), otherwise the earliest in program
    order. Nodes that neither allocate nor free are taken as soon as ready; input-independent
    nodes (masks, rotary tables) are deferred and pulled in just before their first consumer."""
    index = {n.id: k for k, n in enumerate(graph.nodes)}
    users: dict[int, list[int]] = {i: [] for i in live}
    for nid in live:
        for i in graph.node(nid).inputs:
            users[i].append(nid)
    arena_root = {n: r for n, r in lay.root.items() if lay.kinds.get(r) == ARENA}
    remaining: dict[int, int] = {}  # arena root -> edges still to be read
    for nid in live:
        for i in graph.node(nid).inputs:
            if i in arena_root:
                remaining[arena_root[i]] = remaining.get(arena_root[i], 0) + 1
    deferred = _input_independent(graph, live)
    # readiness counts only inputs that are scheduled on their own (not deferred ones)
    missing = {nid: len({i for i in graph.node(nid).inputs if i not in deferred}) for nid in live}
    order: list[int] = []
    scheduled: set[int] = set()
    ready: set[int] = set()
    free_now: list[int] = []

    def is_free(nid: int) -> bool:
        return nid not in lay.nbytes and not any(i in arena_root for i in graph.node(nid).inputs)

    def make_ready(nid: int) -> None:
        if is_free(nid):
            free_now.append(nid)
        else:
            ready.add(nid)

    def emit(nid: int) -> None:
        scheduled.add(nid)
        order.append(nid)
        for i in graph.node(nid).inputs:
            if i in arena_root:
                remaining[arena_root[i]] -= 1
        if nid in deferred:
            return
        for u in set(users[nid]):
            missing[u] -= 1
            if missing[u] == 0 and u not in deferred:
                make_ready(u)

    def pull(nid: int) -> None:  # schedule deferred ancestors depth-first, then nid
        _post_order(graph, nid, scheduled, emit)

    def score(nid: int) -> tuple[int, int]:
        edges: dict[int, int] = {}
        for i in graph.node(nid).inputs:
            if i in arena_root:
                edges[arena_root[i]] = edges.get(arena_root[i], 0) + 1
        freed = sum(lay.nbytes[r] for r, k in edges.items() if remaining[r] == k)
        net = lay.nbytes.get(nid, 0) - freed
        return (min(net, 0), index[nid])

    for nid in _program_order(graph, live):
        if missing[nid] == 0 and nid not in deferred:
            make_ready(nid)
    while free_now or ready:
        if free_now:
            pull(free_now.pop())
            continue
        best = min(ready, key=score)
        ready.discard(best)
        pull(best)
    for nid in _program_order(graph, live):  # deferred nodes nobody pulled (outputs)
        if nid not in scheduled:
            pull(nid)
    return order


def _input_independent(graph: Graph, live: set[int]) -> set[int]:
    """Computed nodes that read no graph input: their results could be computed at any time."""
    dep: dict[int, bool] = {}
    out: set[int] = set()
    for n in graph.nodes:
        if n.id not in live:
            continue
        dep[n.id] = n.op == "input" or any(dep[i] for i in n.inputs)
        if not dep[n.id] and n.op not in LEAF_OPS and n.op != "scalar":
            out.add(n.id)
    return out


# --- 3. liveness and in-place reuse ------------------------------------------------------------
@dataclass
class _Lifetimes:
    start: dict[int, int]
    end: dict[int, int]  # arena buffers: extended over their aliases' uses
    inplace_of: dict[int, int]
    slot: dict[int, int]  # arena buffer -> first buffer of its in-place chain


def _lifetimes(graph: Graph, order: list[int], lay: Layout) -> _Lifetimes:
    pos = {nid: p for p, nid in enumerate(order)}
    end: dict[int, int] = {nid: p for nid, p in pos.items()}
    for p, nid in enumerate(order):
        for i in graph.node(nid).inputs:
            end[i] = max(end[i], p)
    start = dict(pos)
    for nid in order:  # a base lives as long as any of its views is used
        if lay.kinds[nid] in (ALIAS, COPY_OUT):
            r = lay.root[nid]
            end[r] = max(end[r], end[nid])
    inplace_of: dict[int, int] = {}
    slot: dict[int, int] = {}
    for p, nid in enumerate(order):
        if lay.kinds[nid] != ARENA:
            continue
        slot[nid] = nid
        r = _inplace_candidate(graph, graph.node(nid), p, lay, end)
        if r is not None:
            inplace_of[nid] = r
            slot[nid] = slot[r]
    return _Lifetimes(start, end, inplace_of, slot)


def _inplace_candidate(graph: Graph, node: Node, p: int, lay: Layout,
                       end: dict[int, int]) -> int | None:
    """An arena buffer this elementwise op may overwrite: read by no later step, read here only
    through views laid out exactly like the result (so each element is read before it is
    written, at the same address), and of the same dtype and size."""
    if get_op(node.op).category != "elementwise":
        return None
    out = lay.meta[node.id]
    for i in node.inputs:
        r = lay.root.get(i)
        if r is None or lay.kinds[r] != ARENA or end[r] != p:
            continue
        x = lay.meta[i]
        if not _same_layout(x, out) or x.storage_offset() != 0:
            continue
        if lay.nbytes[r] != lay.nbytes.get(node.id) or x.dtype != out.dtype:
            continue
        if all(_same_layout(lay.meta[j], x) and lay.meta[j].storage_offset() == 0
               for j in node.inputs if lay.root.get(j) == r):
            return r
    return None


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    # strides of size-1 dims too: torch only accepts an out= that fully overlaps an input when
    # the two have identical strides (anything else is a "partial overlap" error)
    return (tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype
            and tuple(a.stride()) == tuple(b.stride()))


def _peak(lt: _Lifetimes, lay: Layout, n_steps: int) -> int:
    """Max over steps of the bytes of arena buffers live at that step (in-place chains once)."""
    delta = np.zeros(n_steps + 1, dtype=np.int64)
    for first, (s, e) in _slots(lt).items():
        delta[s] += lay.nbytes[first]
        delta[e + 1] -= lay.nbytes[first]
    return int(np.cumsum(delta).max()) if n_steps else 0


def _slots(lt: _Lifetimes) -> dict[int, tuple[int, int]]:
    """In-place chains as one interval each: first buffer -> (first start, last end)."""
    spans: dict[int, tuple[int, int]] = {}
    for nid, first in lt.slot.items():
        s, e = spans.get(first, (lt.start[first], lt.end[first]))
        spans[first] = (min(s, lt.start[nid]), max(e, lt.end[nid]))
    return spans


# --- 4. offsets ---------------------------------------------------------------------------------
# Both placers see in-place chains as single intervals; sizes are multiples of ALIGN, so every
# offset is too. The smaller arena of the two is kept.
Spans = dict[int, tuple[int, int]]


def _place_by_size(sizes: dict[int, int], spans: Spans) -> tuple[dict[int, int], int]:
    """Greedy by size, best fit: largest first, each into the smallest gap left between the
    buffers already placed that overlap it in time (or on top of them)."""
    items = sorted(spans, key=lambda k: (-sizes[k], spans[k][0], k))
    n = len(items)
    p_start, p_end, p_off, p_size = (np.empty(n, dtype=np.int64) for _ in range(4))
    offsets: dict[int, int] = {}
    top = 0
    for k, key in enumerate(items):
        s, e = spans[key]
        size = sizes[key]
        mask = (p_start[:k] <= e) & (s <= p_end[:k])
        busy = sorted(zip(p_off[:k][mask].tolist(), p_size[:k][mask].tolist()))
        best, best_gap, cursor = None, None, 0
        for off, sz in busy:
            gap = off - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, off + sz)
        offset = cursor if best is None else best
        offsets[key] = offset
        p_start[k], p_end[k], p_off[k], p_size[k] = s, e, offset, size
        top = max(top, offset + size)
    return offsets, top


def _place_skyline(sizes: dict[int, int], spans: Spans) -> tuple[dict[int, int], int]:
    """Bottom-up best fit on a skyline (after Sekiyama et al., 2018): take the lowest segment
    of the skyline (a time range at one height), put there the longest-lived buffer (then the
    largest) whose lifetime fits inside that range; when none fits, raise the segment to its
    lower neighbour. Long-lived buffers settle at the bottom, which greedy-by-size gets wrong
    when a small long-lived buffer spans several large short-lived ones."""
    if not spans:
        return {}, 0
    by_start = sorted(spans, key=lambda k: (spans[k][0], k))
    starts = [spans[k][0] for k in by_start]
    segs = [[0, max(e for _, e in spans.values()), 0]]  # [first step, last step, height]
    offsets: dict[int, int] = {}
    top = 0
    while len(offsets) < len(spans):
        i = min(range(len(segs)), key=lambda j: (segs[j][2], segs[j][0]))
        t0, t1, h = segs[i]
        best, best_key = None, None
        for j in range(bisect.bisect_left(starts, t0), bisect.bisect_right(starts, t1)):
            k = by_start[j]
            s, e = spans[k]
            if k not in offsets and e <= t1:
                key = (s - e, -sizes[k], k)
                if best_key is None or key < best_key:
                    best, best_key = k, key
        if best is None:
            segs[i][2] = min(segs[j][2] for j in (i - 1, i + 1) if 0 <= j < len(segs))
            merged: list[list[int]] = []
            for seg in segs:
                if merged and merged[-1][2] == seg[2]:
                    merged[-1][1] = seg[1]
                else:
                    merged.append(seg)
            segs = merged
            continue
        s, e = spans[best]
        offsets[best] = h
        top = max(top, h + sizes[best])
        pieces = [[t0, s - 1, h]] if t0 < s else []
        pieces.append([s, e, h + sizes[best]])
        if e < t1:
            pieces.append([e + 1, t1, h])
        segs[i:i + 1] = pieces
    return offsets, top


def _place(sizes: dict[int, int], spans: Spans) -> tuple[dict[int, int], int]:
    return min(_place_skyline(sizes, spans), _place_by_size(sizes, spans), key=lambda r: r[1])


# --- the planner --------------------------------------------------------------------------------
def plan_memory(graph: Graph, order: list[int] | None = None) -> MemoryPlan:
    """Plan the arena of `graph`. With `order`, that schedule is used as given; otherwise the
    lowest-peak of the candidate schedules is kept."""
    lay = analyse_layout(graph)
    live = graph.live_ids()
    if order is not None:
        candidates = {"given": list(order)}
    else:
        candidates = {"program": _program_order(graph, live), "dfs": _dfs_order(graph, live),
                      "greedy": _greedy_order(graph, live, lay)}
    best: tuple[int, str, list[int], _Lifetimes] | None = None
    for name, cand in candidates.items():
        lt = _lifetimes(graph, cand, lay)
        peak = _peak(lt, lay, len(cand))
        if best is None or peak < best[0]:
            best = (peak, name, cand, lt)
    assert best is not None
    peak, name, chosen, lt = best
    spans = _slots(lt)
    offsets, arena = _place({k: lay.nbytes[k] for k in spans}, spans)
    buffers: dict[int, Buffer] = {}
    for nid in chosen:
        kind = lay.kinds[nid]
        if kind == ARENA:
            buffers[nid] = Buffer(nid, offsets[lt.slot[nid]], lay.nbytes[nid], lt.start[nid],
                                  lt.end[nid], inplace_of=lt.inplace_of.get(nid))
        elif kind in (ALIAS, COPY_OUT):
            r = lay.root[nid]
            m = lay.meta[nid]
            lo, hi = _span(m)
            buffers[nid] = Buffer(nid, offsets[lt.slot[r]] + lo, hi - lo, lt.start[nid],
                                  lt.end[nid], alias_of=r)
    naive = sum(lay.nbytes.values())
    strides = {k: v for k, v in lay.strides.items() if k in live}
    return MemoryPlan(chosen, buffers, arena, peak, naive, dict(lay.kinds), strides, name)


def _span(t: torch.Tensor) -> tuple[int, int]:
    """Bytes [lo, hi) of its base that a view can touch."""
    isz = t.element_size()
    lo = t.storage_offset() * isz
    if t.numel() == 0:
        return lo, lo
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return lo, lo + (last + 1) * isz


# --- the checker --------------------------------------------------------------------------------
def check_plan(graph: Graph, plan: MemoryPlan) -> None:
    """Raise PlanError unless the plan is a valid placement for this graph: a topological order
    of exactly the live nodes; every buffer aligned, inside the arena, as large as its tensor and
    live from its producer to its last use (a base: to its views' last use); no two buffers that
    are live at the same step share a byte, except an in-place result and the buffer it
    overwrites at that step; every view inside its base, in bytes and in time."""
    live = graph.live_ids()
    pos = _check_order(graph, plan.order, live)
    last = dict(pos)
    for nid in plan.order:
        for i in graph.node(nid).inputs:
            last[i] = max(last[i], pos[nid])
    for nid, kind in plan.kinds.items():
        if kind in (ARENA, ALIAS, COPY_OUT) and nid not in plan.buffers:
            raise PlanError(f"%{nid} ({kind}) has no buffer")
    for b in plan.buffers.values():
        _check_buffer(graph, plan, b, pos, last, live)
    _check_overlaps(plan)


def _check_order(graph: Graph, order: list[int], live: set[int]) -> dict[int, int]:
    pos: dict[int, int] = {}
    for p, nid in enumerate(order):
        if nid in pos:
            raise PlanError(f"the schedule lists %{nid} twice")
        if nid not in live:
            raise PlanError(f"the schedule lists %{nid}, which no output needs")
        for i in graph.node(nid).inputs:
            if i not in pos:
                raise PlanError(f"the schedule is not topological: %{nid} at step {p} reads "
                                f"%{i} before it is computed")
        pos[nid] = p
    missing = live - pos.keys()
    if missing:
        raise PlanError(f"the schedule misses live node(s) {sorted(missing)[:10]}")
    return pos


def _check_buffer(graph: Graph, plan: MemoryPlan, b: Buffer, pos: dict[int, int],
                  last: dict[int, int], live: set[int]) -> None:
    nid = b.node_id
    where = f"buffer of %{nid} [{b.offset}, {b.offset + b.nbytes})"
    if nid not in live:
        raise PlanError(f"{where}: %{nid} is not a live node")
    if b.offset < 0 or b.nbytes < 0 or b.offset + b.nbytes > plan.arena_bytes:
        raise PlanError(f"{where} lies outside the arena of {plan.arena_bytes} bytes")
    if b.start != pos[nid]:
        raise PlanError(f"{where} starts at step {b.start}, but %{nid} is computed at step "
                        f"{pos[nid]}")
    if b.end < last[nid]:
        raise PlanError(f"{where} ends at step {b.end}, but %{nid} is read at step {last[nid]}")
    if b.alias_of is not None:
        base = plan.buffers.get(b.alias_of)
        if base is None or base.alias_of is not None:
            raise PlanError(f"{where}: its base %{b.alias_of} is not an arena buffer")
        if not (base.offset <= b.offset and b.offset + b.nbytes <= base.offset + base.nbytes):
            raise PlanError(f"{where} is a view outside its base's bytes "
                            f"[{base.offset}, {base.offset + base.nbytes})")
        if not (base.start <= b.start and b.end <= base.end):
            raise PlanError(f"{where}: the view is used at steps {b.start}..{b.end}, but its "
                            f"base %{base.node_id} only lives {base.start}..{base.end}")
        return
    if b.offset % ALIGN:
        raise PlanError(f"{where}: offset is not {ALIGN}-byte aligned")
    t = graph.node(nid).type
    need = tensor_bytes(t) if is_tensor(t) else 0  # type: ignore[arg-type]
    if b.nbytes < need:
        raise PlanError(f"{where} holds {b.nbytes} bytes, but %{nid} is {t} ({need} bytes)")
    if b.inplace_of is not None:
        src = plan.buffers.get(b.inplace_of)
        if src is None or src.alias_of is not None:
            raise PlanError(f"{where}: in place of %{b.inplace_of}, which is not an arena buffer")
        if (src.offset, src.nbytes) != (b.offset, b.nbytes) or src.end != b.start:
            raise PlanError(f"{where}: in place of %{src.node_id}, but not at its bytes or not "
                            f"where it dies (step {src.end})")
        if get_op(graph.node(nid).op).category != "elementwise":
            raise PlanError(f"{where}: only elementwise ops are written in place")


def _check_overlaps(plan: MemoryPlan) -> None:
    own = sorted((b for b in plan.buffers.values() if b.alias_of is None and b.nbytes > 0),
                 key=lambda b: (b.start, b.node_id))
    active: list[Buffer] = []
    for b in own:
        active = [a for a in active if a.end >= b.start]
        for a in active:
            if a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes:
                if _inplace_pair(a, b) or _inplace_pair(b, a):
                    continue
                raise PlanError(
                    f"buffers of %{a.node_id} [{a.offset}, {a.offset + a.nbytes}) steps "
                    f"{a.start}..{a.end} and %{b.node_id} [{b.offset}, {b.offset + b.nbytes}) "
                    f"steps {b.start}..{b.end} share bytes while both are live")
        active.append(b)


def _inplace_pair(src: Buffer, dst: Buffer) -> bool:
    return dst.inplace_of == src.node_id and src.end == dst.start
