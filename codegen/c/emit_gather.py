"""Kernels whose elements depend on their positions: the gathers by index tensors
(index_select, gather, index: aten.index.Tensor), arange, triu and tril.

Out-of-range indices: torch raises, and so does the call: every index is checked against its
dim before the read; an out-of-range one reads nothing (its element is NaN or 0) and sets
`eq_index_error`, which CRuntime turns into a KernelIndexError after the call. index_select and
gather accept [0, n) as torch does; index also wraps [-n, 0) as torch does."""

from __future__ import annotations

from math import prod

import torch

from ...ir import Node
from .emit_reduce import flat_offset
from .loops import PARALLEL_MIN, broadcast_strides, loop_nest
from .values import Ref

GATHER_OPS = frozenset({"index_select", "gather", "index", "arange", "triu", "tril"})
INDEX_CT = ("int64_t", "int32_t")


def _poison(ct: str) -> str:
    return f"({ct})NAN" if ct in ("float", "double") else f"({ct})0"


def emit_gather(node: Node, out: Ref, ins: list[Ref]) -> str | None:
    if any(r.space == "scalar" for r in ins):
        return None
    if node.op == "arange":
        return _arange(node, out)
    if node.op in ("triu", "tril"):
        return _triangle(node, out, ins[0])
    x = ins[0]
    if out.dtype != x.dtype or not x.shape or any(r.ctype not in INDEX_CT for r in ins[1:]):
        return None
    if node.op == "index_select":
        d = node.attrs["dim"] % len(x.shape)
        idx = ins[1]
        # the index runs along out's dim d, x's other dims along themselves
        ist = tuple(idx.strides[0] if k == d and idx.shape else 0 for k in range(len(x.shape)))
        return _gather(out, x, [(d, idx, ist)], _zero(x.strides, [d]), wrap=False)
    if node.op == "gather":
        d = node.attrs["dim"] % len(x.shape)
        idx = ins[1]  # out has idx's shape; x's other dims run along it (torch checks sizes)
        if idx.shape != out.shape or len(idx.shape) != len(x.shape):
            return None
        return _gather(out, x, [(d, idx, idx.strides)], _zero(x.strides, [d]), wrap=False)
    return _index(node, out, x, ins[1:])


def emit_row_write(dim: int, ins: list[Ref]) -> str | None:
    """A model's state write run in place (capture/state.py `rows_at`): state[.., pos[t], ..] =
    values[.., t, ..] along `dim`, in the state's own storage (a KV cache's new keys). Each
    position is checked as torch does (negatives from the end); one out of range writes
    nothing and sets eq_index_error. None where the operands are not of that form."""
    state, pos, values = ins
    if dim < 0:
        dim += len(state.shape)
    if pos.ctype not in INDEX_CT or len(pos.shape) != 1 or values.dtype != state.dtype or \
            not 0 <= dim < len(state.shape):
        return None
    rows = (*state.shape[:dim], pos.shape[0], *state.shape[dim + 1:])  # values broadcast to it
    if len(values.shape) > len(rows) or any(
            m not in (1, r) for m, r in zip(values.shape[::-1], rows[::-1])):
        return None
    n = state.shape[dim]
    vst = broadcast_strides(rows, values.shape, values.strides)
    pst = tuple(pos.strides[0] if k == dim else 0 for k in range(len(rows)))
    decl = (f"{state.ctype}* s = {state.ptr(const=False)};\n"
            f"const {values.ctype}* v = {values.ptr()};\nconst {pos.ctype}* ix = {pos.ptr()};")

    def body(offs: list[str]) -> str:
        return (f"    int64_t q = (int64_t)ix[{offs[2]}];\n    q += q < 0 ? {n} : 0;\n"
                f"    if ((uint64_t)q < {n}ULL) s[{offs[0]} + q * {state.strides[dim]}] = "
                f"v[{offs[1]}];\n    else EQ_INDEX_ERROR();")
    return decl + "\n" + loop_nest(rows, [_zero(state.strides, [dim]), vst, pst], body)


def _zero(strides: tuple[int, ...], dims: list[int]) -> tuple[int, ...]:
    return tuple(0 if k in dims else s for k, s in enumerate(strides))


def _gather(out: Ref, x: Ref, picks: list[tuple[int, Ref, tuple[int, ...]]],
            xst: tuple[int, ...], wrap: bool) -> str:
    """out[i] = x[base(i) + sum_k q_k * x.strides[d_k]], q_k = idx_k[i] (idx_k's strides over
    out's shape), each q_k checked against x.shape[d_k] (`wrap`: negatives count from the end)
    and the element poisoned when one is out of range; base(i): `xst` over out's shape."""
    decl = [f"{out.ctype}* o = {out.ptr(const=False)};", f"const {x.ctype}* x = {x.ptr()};"]
    decl += [f"const {r.ctype}* ix{k} = {r.ptr()};" for k, (_, r, _) in enumerate(picks)]
    strides = [out.strides, xst] + [st for _, _, st in picks]

    def body(offs: list[str]) -> str:
        lines, ok, at = [], [], [offs[1]]
        for k, (d, _, _) in enumerate(picks):
            n = x.shape[d]
            lines.append(f"int64_t q{k} = (int64_t)ix{k}[{offs[k + 2]}];")
            if wrap:
                lines.append(f"q{k} += q{k} < 0 ? {n} : 0;")
            ok.append(f"(uint64_t)q{k} < {n}ULL")
            at.append(f"q{k} * {x.strides[d]}")
        lines.append(f"if ({' && '.join(ok)}) o[{offs[0]}] = x[{' + '.join(at)}];")
        lines.append(f"else {{ o[{offs[0]}] = {_poison(out.ctype)}; EQ_INDEX_ERROR(); }}")
        return "    " + "\n    ".join(lines)
    return "\n".join(decl) + "\n" + loop_nest(out.shape, strides, body)


def _index(node: Node, out: Ref, x: Ref, idxs: list[Ref]) -> str | None:
    """aten.index.Tensor: index tensors (broadcast together to b) at `positions`, full
    slices elsewhere; b's dims replace the indexed dims where they are adjacent, else they
    lead (torch's rule)."""
    pos = node.attrs["positions"]
    if len(pos) != len(idxs) or len(set(pos)) != len(pos) or max(pos) >= len(x.shape):
        return None
    pairs = sorted(zip(pos, idxs), key=lambda p: p[0])
    pos = [p for p, _ in pairs]
    b = tuple(torch.broadcast_shapes(*(r.shape for _, r in pairs)))
    nb = len(b)
    rest = [d for d in range(len(x.shape)) if d not in pos]
    adjacent = pos == list(range(pos[0], pos[0] + len(pos)))
    lead = [d for d in rest if d < pos[0]] if adjacent else []
    order = [("x", d) for d in lead] + [("b", k) for k in range(nb)] + \
        [("x", d) for d in rest if d not in lead]
    if tuple(x.shape[d] if w == "x" else b[d] for w, d in order) != out.shape:
        return None
    xst = tuple(x.strides[d] if w == "x" else 0 for w, d in order)
    picks = []
    for d, r in pairs:
        bs = broadcast_strides(b, r.shape, r.strides)
        picks.append((d, r, tuple(bs[k] if w == "b" else 0 for w, k in order)))
    return _gather(out, x, picks, xst, wrap=True)


def _arange(node: Node, out: Ref) -> str | None:
    """start + i * step: in double for floats (torch's CPU arange computes in its accumulate
    type, double), in int64 for integers (torch truncates the bounds to integers)."""
    if out.ctype == "_Bool" or len(out.shape) != 1:
        return None
    a = node.attrs
    if out.ctype in ("float", "double"):
        start, step = float(a["start"]).hex(), float(a["step"]).hex()
        val = f"{start} + {step} * (double)i"
    else:
        val = f"{int(a['start'])}LL + {int(a['step'])}LL * i"
    n = out.shape[0]
    par = "parallel for simd schedule(static)" if n >= PARALLEL_MIN else "simd"
    return (f"{out.ctype}* o = {out.ptr(const=False)};\n#pragma omp {par}\n"
            f"for (int64_t i = 0; i < {n}; i++) o[i * {out.strides[0]}] = ({out.ctype})({val});")


def _triangle(node: Node, out: Ref, x: Ref) -> str | None:
    """triu/tril over the last two dims: out[.., i, j] = x[.., i, j] where j - i >= diagonal
    (triu) / <= diagonal (tril), else 0; one task per row, rows shared by the threads. Each
    element is read before it is written at the same place, so it may run in place."""
    if len(out.shape) < 2 or x.dtype != out.dtype:
        return None
    *lead, rows, cols = out.shape
    keep = f"j - i {'>=' if node.op == 'triu' else '<='} {node.attrs['diagonal']}"

    def off(strides: tuple[int, ...]) -> str:  # flat task t = (lead index, row i)
        return flat_offset("t", lead + [rows], list(strides[:-1]))

    par = "#pragma omp parallel for schedule(static)\n" if prod(out.shape) >= PARALLEL_MIN \
        else ""
    return (f"{out.ctype}* o = {out.ptr(const=False)};\nconst {x.ctype}* x = {x.ptr()};\n"
            f"{par}for (int64_t t = 0; t < {prod(lead) * rows}; t++) {{\n"
            f"const int64_t i = t % {rows};\n{out.ctype}* orow = o + {off(out.strides)};\n"
            f"const {x.ctype}* xrow = x + {off(x.strides)};\n#pragma omp simd\n"
            f"for (int64_t j = 0; j < {cols}; j++) orow[j * {out.strides[-1]}] = "
            f"{keep} ? xrow[j * {x.strides[-1]}] : ({out.ctype})0;\n}}")
