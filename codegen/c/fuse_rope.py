"""Rotary embedding in the Q/K projection's epilogue.

The pattern, on the planned program: a GEMM against a packed constant writes T [M, N] (rows
of stride ldc: its geometry's m and ldc, gemm_geometry.py); a rope reads a head split of T's
columns (slice -> view -> permute: element (b, h, s, j) is T[b * S + s, c0 + h * d + j]) and
writes its own buffer. The GEMM kernel then runs the rope on each block of rows as soon as
that block's head is computed, while the rows are in L1 (`eq_gemm_packed_rope`,
packed_gemm.py), and the rope's own kernel is dropped. A rope pairs column j with j + d/2 of
its head, so the GEMM visits its columns a head at a time (d a multiple of the packed panel's
PACKED_PANEL columns, c0 a multiple of d).

The memory plan is not changed: the rope's output is now written at the GEMM's place in the
schedule, earlier than the plan assumed. So a rope is fused only when no kernel scheduled
between the GEMM and the rope (nor the GEMM itself) reads or writes bytes of the rope's
output, and its cos and sin are computed before the GEMM. The torch steps that run between
C segments (emit.py) count as kernels here: they read and write the same arena."""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import Graph
from ...plan import ARENA, COPY_OUT, LEAF, OUTPUT, SCALAR, TEMP, MemoryPlan
from .fuse_elementwise import Group, overlaps
from .gemm_geometry import gemm_geometry
from .loops import broadcast_strides
from .tiles import PACKED_PANEL
from .values import Ref

# the ops whose packed-GEMM emitters may take rope epilogues (emit_matmul, emit_gemm)
GEMM_OPS = frozenset({"matmul", "mm", "gemm"})
ROLES = ("b", "h", "s")  # batch, head, position: the rope's dims other than the last


@dataclass(frozen=True)
class RopeEpilogue:
    node: int  # the rope
    c0: int  # its first column in the GEMM's output
    heads: int
    d: int  # head dim
    rows_per_b: int  # S: GEMM row m is position m % S of batch m // S
    out: Ref
    cos: Ref
    sin: Ref
    dims: dict[str, int | None]  # role -> the rope's dim holding it (None: size 1)

    def c_init(self) -> str:
        """The eq_rope initializer (packed_gemm.py)."""
        def strides(r: Ref, along_head: bool = True) -> str:
            # by role (b, h, s), then (cos, sin) along the head's columns; 0 where broadcast
            st = broadcast_strides(self.out.shape, r.shape, r.strides)
            dims = [*(self.dims[k] for k in ROLES), *([-1] if along_head else [])]
            return ", ".join(str(st[i]) if i is not None else "0" for i in dims)

        return (f"{{{self.c0}, {self.c0 + self.heads * self.d}, {self.d}, {self.rows_per_b}, "
                f"{self.out.ptr(const=False)}, {strides(self.out, along_head=False)}, "
                f"{self.cos.ptr()}, {strides(self.cos)}, {self.sin.ptr()}, {strides(self.sin)}}}")


def packed_gemm_call(ropes: tuple[RopeEpilogue, ...], m_base: str) -> tuple[str, str, str]:
    """(the packed GEMM function to call, a declaration to put before the call, trailing
    arguments): eq_gemm_packed without ropes, eq_gemm_packed_rope with them (m_base: the C
    expression of the absolute row of the call's first row)."""
    if not ropes:
        return "eq_gemm_packed", "", ""
    decl = f"const eq_rope ro[] = {{{', '.join(r.c_init() for r in ropes)}}};"
    panels = ropes[0].d // PACKED_PANEL  # a head's columns, in panels
    return "eq_gemm_packed_rope", decl, f", {m_base}, ro, {len(ropes)}, {panels}"


def _head_split(x: Ref, t: Ref, m: int, ldc: int) -> tuple[int, int, int, int,
                                                        dict[str, int | None]] | None:
    """How the rope's input x reads the GEMM output t: (c0, heads, d, S, roles), or None when
    it is not a head split of t's columns covering every row."""
    if x.space != t.space or x.slot != t.slot or x.root != t.root or len(x.shape) < 2:
        return None
    d, n = x.shape[-1], t.shape[-1]
    c0 = x.offset - t.offset
    if x.strides[-1] != 1 or d % PACKED_PANEL or not 0 <= c0 < ldc or c0 % d:
        return None
    dims: dict[str, int | None] = {k: None for k in ROLES}
    size = {k: 1 for k in ROLES}
    # the first non-trivial dim of stride ldc is the position; S * ldc the batch; d the head
    for i, (k, s) in enumerate(zip(x.shape[:-1], x.strides[:-1])):
        if k == 1:
            continue
        role = "s" if s == ldc and dims["s"] is None else "h" if s == d and d < ldc else "b"
        if dims[role] is not None:
            return None
        dims[role], size[role] = i, k
    b_dim = dims["b"]
    if b_dim is not None and x.strides[b_dim] != size["s"] * ldc:
        return None
    heads = size["h"]
    if size["b"] * size["s"] != m or c0 + heads * d > n:
        return None
    return c0, heads, d, size["s"], dims


def rope_epilogues(graph: Graph, plan: MemoryPlan, refs: dict[int, Ref],
                   groups: list[Group]) -> dict[int, tuple[RopeEpilogue, ...]]:
    """For each GEMM node, the ropes its epilogue may compute (all of one head dim), in plan
    order. Whether the GEMM's kernel takes them is its emitter's call (the packed path)."""
    pos = {nid: k for k, nid in enumerate(plan.order)}
    group_inputs = {g.root: g.inputs for g in groups}
    found: dict[int, list[RopeEpilogue]] = {}
    for nid in plan.order:
        node = graph.node(nid)
        if node.op != "rope" or plan.kinds[nid] not in (ARENA, OUTPUT) or nid not in refs:
            continue
        x, cos, sin, out = (refs.get(i) for i in (*node.inputs, nid))
        gemm = x.root if x is not None else -1
        if gemm not in refs or graph.node(gemm).op not in GEMM_OPS or cos is None \
                or sin is None or out is None:
            continue
        t, a = refs[gemm], refs.get(graph.node(gemm).inputs[0])
        # the packed path's rows: evenly spaced, unit columns (what its emitters require)
        geo = gemm_geometry(t, a) if a is not None else None
        if geo is None or not geo.rows_evenly_spaced or not geo.unit_columns or any(
                r.dtype != "float32" or r.space == "scalar" for r in (x, cos, sin, out, t)):
            continue
        split = _head_split(x, t, geo.m, geo.ldc)
        if split is None or out.strides[-1] != 1:
            continue
        c0, heads, d, s, dims = split
        ep = RopeEpilogue(nid, c0, heads, d, s, out, cos, sin, dims)
        earlier = found.get(gemm, [])
        if earlier and earlier[0].d != d:
            continue
        if _safe(graph, plan, refs, group_inputs, pos, gemm, ep, earlier):
            found.setdefault(gemm, []).append(ep)
    return {g: tuple(eps) for g, eps in found.items()}


def _safe(graph: Graph, plan: MemoryPlan, refs: dict[int, Ref],
          group_inputs: dict[int, tuple[int, ...]], pos: dict[int, int], gemm: int,
          ep: RopeEpilogue, earlier: list[RopeEpilogue]) -> bool:
    """Writing ep.out at the GEMM's place in the schedule clobbers nothing that is read or
    written before the rope's own place (an elementwise group's kernel reads its members'
    inputs: `group_inputs` by root), and cos and sin are ready by then."""
    out = ep.out
    for r in (ep.cos, ep.sin):
        if plan.kinds.get(r.root) not in (LEAF, SCALAR) and pos.get(r.root, 1 << 60) >= pos[gemm]:
            return False
    if any(overlaps(out, e.out) for e in earlier):
        return False
    fused_earlier = {e.node for e in earlier}
    for w in plan.order[pos[gemm]:pos[ep.node]]:
        # a torch step counts as a kernel: it reads its inputs and writes its buffer then
        # (TEMP: a tuple torch allocates, from inputs that may lie in the arena)
        if w in fused_earlier or plan.kinds[w] not in (ARENA, OUTPUT, COPY_OUT, TEMP):
            continue
        touched = [w, *graph.node(w).inputs, *group_inputs.get(w, ())]
        if any(i in refs and overlaps(out, refs[i]) for i in touched):
            return False
    return True
