"""Gathers: embedding (rows of a weight by id), index with one index tensor, index_select.
Every index is checked before its read: an out-of-range one reads nothing and sets the
launch's `index_error` flag, and the runtime raises KernelIndexError after the call, as torch
raises (and as the C backend does)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from ...ir import Node
from ..c.loops import broadcast_strides
from .elementwise import TL_DTYPES, Deferred, Source, block_size, unravel
from .launch import FLOATS, Launch, Operand, device, interpreting, row_levels


@triton.jit
def embedding_kernel(w, idx, o, err, n_rows, V, D, n1, n2, is0, is1, is2, os0, os1, os2, oc,
                     wr, wc, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = rows < n_rows
    a, b, c_ = rows // (n1 * n2), rows // n2 % n1, rows % n2
    r = tl.load(idx + a * is0 + b * is1 + c_ * is2, mask=live, other=0).to(tl.int64)
    bad = live & ((r < 0) | (r >= V))
    tl.store(err + rows * 0, 1, mask=bad)
    ok = (live & ~bad)[:, None]
    for c0 in range(0, D, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        m = ok & (c < D)[None, :]
        v = tl.load(w + r[:, None] * wr + (c * wc)[None, :], mask=m, other=0.0)
        out = (a * os0 + b * os1 + c_ * os2)[:, None] + (c * oc)[None, :]
        tl.store(o + out, v.to(o.dtype.element_ty), mask=m)


def plan_embedding(node: Node, out: Operand, ins: list[Operand]) -> list[Launch] | None:
    w, idx = ins
    if len(w.shape) != 2 or idx.dtype not in ("int64", "int32") or out.dtype != w.dtype \
            or w.dtype not in FLOATS or idx.is_scalar or not idx.shape:
        return None
    v, d = w.shape
    levels = row_levels([(idx.shape, idx.strides), (idx.shape, out.strides[:-1])])
    if levels is None:
        return None
    (_, s0), (n1, s1), (n2, s2) = levels
    n_rows = math.prod(idx.shape)
    block = min(1 << max(d - 1, 1).bit_length(), 1024)
    rows = max(1, min(1 << max(n_rows - 1, 0).bit_length(),
                      ((1 << 16) if interpreting() else 4096) // block))
    err = torch.zeros(1, dtype=torch.int32, device=device())
    args = [w, idx, out, err, n_rows, v, d, n1, n2, s0[0], s1[0], s2[0], s0[1], s1[1], s2[1],
            out.strides[-1], w.strides[0], w.strides[1]]
    return [Launch("embedding", embedding_kernel, (max(1, -(-n_rows // rows)),), args,
                   {"ROWS": rows, "BLOCK": block}, index_error=err)]


def plan_index(node: Node, out: Operand, ins: list[Operand], name: str, source: Source,
               module: Callable[[], Any]) -> list[Launch] | None:
    """index with index tensors at consecutive dims (x[..., i, j, ...], the other dims whole;
    the index tensors broadcast together) and index_select: a generated kernel over the
    output, each index read (its broadcast strides), wrapped if negative as torch's index does, and
    checked before the gather."""
    x, idxs = ins[0], ins[1:]
    if node.op == "index":
        dims = list(node.attrs["positions"])
        if dims != list(range(dims[0], dims[0] + len(dims))):
            return None  # separated index tensors move their dims first: not generated
    else:
        dims = [node.attrs["dim"] % max(len(x.shape), 1)]
        if len(idxs[0].shape) != 1:
            return None
    if any(t.is_scalar or t.dtype not in ("int64", "int32") for t in idxs) \
            or x.dtype not in TL_DTYPES or out.dtype != x.dtype or not x.shape:
        return None
    numel = math.prod(out.shape)
    if numel == 0:
        return None
    p, k = dims[0], len(dims)
    nb = len(out.shape) - (len(x.shape) - k)  # the dims of the broadcast index shape
    bshape = out.shape[p:p + nb]
    x_dims = [*range(p), *range(p + nb, len(out.shape))]  # out dims that are x's own
    x_own = [*range(p), *range(p + k, len(x.shape))]
    x_at = " + ".join([f"d{o} * {x.strides[j]}" for o, j in zip(x_dims, x_own)]
                      + [f"r{j} * {x.strides[p + j]}" for j in range(k)])
    o_at = " + ".join(f"d{d} * {s}" for d, s in enumerate(out.strides)) or "i * 0"
    block = block_size(numel)
    ixs = ", ".join(f"ix{j}" for j in range(k))
    lines = ["@triton.jit", f"def {name}(o, x0, {ixs}, err, BLOCK: tl.constexpr):",
             "    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
             f"    m = i < {numel}", *unravel(list(out.shape)), "    ok = m"]
    for j, t in enumerate(idxs):
        st = broadcast_strides(bshape, t.shape, t.strides)
        at = " + ".join(f"d{p + d} * {s}" for d, s in enumerate(st) if s) or "i * 0"
        n = x.shape[p + j]
        lines.append(f"    r{j} = tl.load(ix{j} + {at}, mask=m, other=0).to(tl.int64)")
        if node.op == "index":  # (index_select refuses a negative id)
            lines.append(f"    r{j} = tl.where(r{j} < 0, r{j} + {n}, r{j})")
        lines.append(f"    ok = ok & (r{j} >= 0) & (r{j} < {n})")
    lines += ["    tl.store(err + i * 0, 1, mask=m & ~ok)",
              f"    tl.store(o + {o_at}, tl.load(x0 + {x_at}, mask=ok), mask=ok)"]
    source.kernels.append("\n".join(lines))
    err = torch.zeros(1, dtype=torch.int32, device=device())
    return [Launch(name, Deferred(module, name), (max(1, -(-numel // block)),),
                   [out, x, *idxs, err], {"BLOCK": block}, index_error=err)]
