"""embedding: rows of a weight gathered by index. Every index is checked before its read: an
out-of-range one reads nothing and sets the launch's `index_error` flag, and the runtime
raises KernelIndexError after the call, as torch raises (and as the C backend does)."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ...ir import Node
from .launch import Launch, Operand, device, interpreting, row_levels

FLOATS = ("float32", "float16", "bfloat16")


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
