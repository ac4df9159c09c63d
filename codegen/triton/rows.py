"""Row kernels: rms_norm, layer_norm (over the last dim), softmax and log_softmax (over the last
dim), and rope, each program computing ROWS whole rows of the last dim in registers.

Leading dims are merged into at most two levels (launch.row_levels); more, a normalised dim
other than the last, or dtypes other than float32/float16/bfloat16 decline (torch runs the
node). A whole row is loaded before any of it is stored, so each kernel is also right in place
of an input laid out like its output (the memory plan's in-place reuse)."""

from __future__ import annotations

import math

import triton
import triton.language as tl

from ...ir import Node
from ..c.loops import broadcast_strides
from .launch import FLOATS, Launch, Operand, interpreting, row_levels


@triton.jit
def _offsets(rows, c, n1, n2, s0, s1, s2, sc):
    # element offsets of rows (a [ROWS] block, over three levels) x columns c (a [BLOCK] block)
    r = (rows // (n1 * n2)) * s0 + (rows // n2 % n1) * s1 + (rows % n2) * s2
    return r[:, None] + (c * sc)[None, :]


@triton.jit
def rms_norm_kernel(x, w, o, n_rows, D, eps, n1, n2, xs0, xs1, xs2, xc, wc, os0, os1, os2, oc,
                    ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK)
    m = (rows < n_rows)[:, None] & (c < D)[None, :]
    xv = tl.load(x + _offsets(rows, c, n1, n2, xs0, xs1, xs2, xc), mask=m, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(xv * xv, 1) / D + eps)
    g = tl.load(w + c * wc, mask=c < D, other=0.0).to(tl.float32)
    y = xv * r[:, None] * g[None, :]
    tl.store(o + _offsets(rows, c, n1, n2, os0, os1, os2, oc), y.to(o.dtype.element_ty), mask=m)


@triton.jit
def layer_norm_kernel(x, w, b, o, n_rows, D, eps, n1, n2, xs0, xs1, xs2, xc, wc, bc,
                      os0, os1, os2, oc,
                      ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK)
    m = (rows < n_rows)[:, None] & (c < D)[None, :]
    xv = tl.load(x + _offsets(rows, c, n1, n2, xs0, xs1, xs2, xc), mask=m, other=0.0).to(tl.float32)
    mu = tl.sum(xv, 1) / D
    t = tl.where(m, xv - mu[:, None], 0.0)
    r = 1.0 / tl.sqrt(tl.sum(t * t, 1) / D + eps)
    g = tl.load(w + c * wc, mask=c < D, other=0.0).to(tl.float32)
    beta = tl.load(b + c * bc, mask=c < D, other=0.0).to(tl.float32)
    y = t * r[:, None] * g[None, :] + beta[None, :]
    tl.store(o + _offsets(rows, c, n1, n2, os0, os1, os2, oc), y.to(o.dtype.element_ty), mask=m)


@triton.jit
def softmax_kernel(x, o, n_rows, D, n1, n2, xs0, xs1, xs2, xc, os0, os1, os2, oc,
                   LOG: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK)
    m = (rows < n_rows)[:, None] & (c < D)[None, :]
    xv = tl.load(x + _offsets(rows, c, n1, n2, xs0, xs1, xs2, xc), mask=m,
                 other=float("-inf")).to(tl.float32)
    t = xv - tl.max(xv, 1)[:, None]
    e = tl.exp(t)
    s = tl.sum(e, 1)[:, None]
    y = t - tl.log(s) if LOG else e / s
    tl.store(o + _offsets(rows, c, n1, n2, os0, os1, os2, oc), y.to(o.dtype.element_ty), mask=m)


@triton.jit
def rope_kernel(x, cos, sin, o, n_rows, D, n1, n2, xs0, xs1, xs2, xc, cs0, cs1, cs2, cc,
                ss0, ss1, ss2, sc,
                os0, os1, os2, oc, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # x * cos + rotate_half(x) * sin, rotate_half(x)[j] = -x[j + D/2] or x[j - D/2]
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK)
    m = (rows < n_rows)[:, None] & (c < D)[None, :]
    h = D // 2
    partner = tl.where(c < h, c + h, c - h)
    xv = tl.load(x + _offsets(rows, c, n1, n2, xs0, xs1, xs2, xc), mask=m, other=0.0).to(tl.float32)
    xp = tl.load(x + _offsets(rows, partner, n1, n2, xs0, xs1, xs2, xc), mask=m, other=0.0)
    rot = tl.where((c < h)[None, :], -xp.to(tl.float32), xp.to(tl.float32))
    cv = tl.load(cos + _offsets(rows, c, n1, n2, cs0, cs1, cs2, cc), mask=m, other=0.0)
    sv = tl.load(sin + _offsets(rows, c, n1, n2, ss0, ss1, ss2, sc), mask=m, other=0.0)
    y = xv * cv.to(tl.float32) + rot * sv.to(tl.float32)
    tl.store(o + _offsets(rows, c, n1, n2, os0, os1, os2, oc), y.to(o.dtype.element_ty), mask=m)


@triton.jit
def arg_extreme_kernel(x, o, n_rows, D, n1, n2, xs0, xs1, xs2, xc, os0, os1, os2,
                       LARGEST: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # the index of the first largest (smallest) element of each row; a NaN counts as the
    # extreme (torch.max / torch.min over a dim): the first NaN wins
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK)
    m = (rows < n_rows)[:, None] & (c < D)[None, :]
    fill = float("-inf") if LARGEST else float("inf")
    xv = tl.load(x + _offsets(rows, c, n1, n2, xs0, xs1, xs2, xc), mask=m, other=fill)
    xv = xv.to(tl.float32)
    nan = (xv != xv) & m  # noqa: PLR0124 - a NaN is not equal to itself
    plain = tl.where(nan, fill, xv)
    ext = tl.max(plain, 1) if LARGEST else tl.min(plain, 1)
    cols = tl.broadcast_to(c[None, :], (ROWS, BLOCK))
    first = tl.min(tl.where((plain == ext[:, None]) & m, cols, BLOCK), 1)
    first_nan = tl.min(tl.where(nan, cols, BLOCK), 1)
    at = tl.where(first_nan < BLOCK, first_nan, first)
    out = (rows // (n1 * n2)) * os0 + (rows // n2 % n1) * os1 + (rows % n2) * os2
    tl.store(o + out, at.to(tl.int64), mask=rows < n_rows)


def plan_arg_extreme(node: Node, out: Operand, ins: list[Operand]) -> list[Launch] | None:
    """argmax / argmin along the last dim (a router's choice: PhiMoE), rows in blocks."""
    x = ins[0]
    if x.is_scalar or x.dtype not in FLOATS or out.dtype != "int64" or not x.shape or \
            node.attrs["dim"] % len(x.shape) != len(x.shape) - 1:
        return None
    lead = x.shape[:-1]
    o_st = out.strides[:len(lead)]  # (keepdim: the trailing 1 is not walked)
    levels = row_levels([(lead, x.strides[:-1]), (lead, o_st)])
    if levels is None:
        return None
    (_, s0), (n1, s1), (n2, s2) = levels
    n_rows, d = math.prod(lead), x.shape[-1]
    r, block, programs = _blocking(n_rows, d)
    args = [x, out, n_rows, d, n1, n2, s0[0], s1[0], s2[0], x.strides[-1], s0[1], s1[1],
            s2[1]]
    return [Launch(node.op, arg_extreme_kernel, (programs,), args,
                   {"LARGEST": node.op == "argmax", "ROWS": r, "BLOCK": block})]


def _blocking(n_rows: int, d: int) -> tuple[int, int, int]:
    """(ROWS, BLOCK, programs): a program holds ROWS whole rows. Compiled, 1-4 rows of a
    row's width in registers; interpreted (~1.4 ms a program), up to 64K elements."""
    block = 1 << max(d - 1, 1).bit_length()
    budget = (1 << 16) if interpreting() else 4096
    rows = max(1, min(1 << max(n_rows - 1, 0).bit_length(), budget // block))
    return rows, block, max(1, -(-n_rows // rows))


def row_choices(n_rows: int, d: int) -> list[dict[str, int]]:
    """The blockings worth measuring for a row kernel (autotune.py), the fixed one (_blocking)
    first: compiled, its rows, half and twice them (up to 16K elements a program), with 2, 4
    or 8 warps (Triton's default, 4, goes with the fixed one); interpreted, the fixed one
    alone."""
    r, block, _ = _blocking(n_rows, d)
    if interpreting():
        return [{"ROWS": r}]
    most = 1 << max(n_rows - 1, 0).bit_length()
    rows = sorted({r} | {x for x in (r // 2, 2 * r) if 1 <= x <= most and x * block <= 1 << 14})
    return [{"ROWS": r}, *({"ROWS": x, "num_warps": w} for x in rows for w in (2, 4, 8)
                           if (x, w) != (r, 4) and w * 32 <= x * block)]


def _tuned(launch: Launch, n_rows: int, d: int, writes: int) -> list[Launch]:
    """launch (its ROWS the fixed choice), its blockings to measure (row_choices) given: the
    kernel writes args[writes]."""
    launch.choices = [((max(1, -(-n_rows // t["ROWS"])),), t) for t in row_choices(n_rows, d)]
    launch.writes = (writes,)
    return [launch]


def _row_args(out: Operand, ins: list[Operand]
              ) -> tuple[int, tuple[int, int], list[list[int]]] | None:
    """(rows, (n1, n2), per operand [s0, s1, s2, last stride]), operands broadcast to out."""
    if not out.shape or any(o.is_scalar or o.dtype not in FLOATS for o in [out, *ins]):
        return None
    lead = out.shape[:-1]
    strides = [out.strides] + [broadcast_strides(out.shape, o.shape, o.strides) for o in ins]
    levels = row_levels([(lead, st[:-1]) for st in strides])
    if levels is None:
        return None
    (_, s0), (n1, s1), (n2, s2) = levels
    return (math.prod(lead), (n1, n2),
            [[s0[k], s1[k], s2[k], st[-1]] for k, st in enumerate(strides)])


def plan_rows(node: Node, out: Operand, ins: list[Operand]) -> list[Launch] | None:
    """The kernel of a row op (rms_norm, layer_norm, softmax, log_softmax, rope), or None."""
    op = node.op
    if op in ("softmax", "log_softmax") and node.attrs["dim"] % max(len(out.shape), 1) != \
            len(out.shape) - 1:
        return None
    if op == "layer_norm" and len(node.attrs["normalized_shape"]) != 1:
        return None
    if op == "rope" and (out.shape[-1:] != ins[0].shape[-1:] or out.shape[-1] % 2):
        return None
    if op in ("rms_norm", "layer_norm") and any(len(o.shape) != 1 for o in ins[1:]):
        return None  # weights of the last dim only
    tensor_ins = [ins[0]] if op in ("rms_norm", "layer_norm") else ins
    rows = _row_args(out, tensor_ins)
    if rows is None or any(o.is_scalar or o.dtype not in FLOATS for o in ins):
        return None
    n_rows, n12, st = rows
    d = out.shape[-1]
    r, block, programs = _blocking(n_rows, d)
    meta = {"ROWS": r, "BLOCK": block}
    x_st, o_st = st[1], st[0]
    if op == "rms_norm":
        args = [ins[0], ins[1], out, n_rows, d, node.attrs["eps"], *n12, *x_st,
                ins[1].strides[0], *o_st]
        return _tuned(Launch(op, rms_norm_kernel, (programs,), args, meta), n_rows, d, 2)
    if op == "layer_norm":
        args = [ins[0], ins[1], ins[2], out, n_rows, d, node.attrs["eps"], *n12, *x_st,
                ins[1].strides[0], ins[2].strides[0], *o_st]
        return _tuned(Launch(op, layer_norm_kernel, (programs,), args, meta), n_rows, d, 3)
    if op in ("softmax", "log_softmax"):
        args = [ins[0], out, n_rows, d, *n12, *x_st, *o_st]
        return _tuned(Launch(op, softmax_kernel, (programs,), args,
                             {"LOG": op == "log_softmax", **meta}), n_rows, d, 1)
    if op == "rope":
        args = [*ins, out, n_rows, d, *n12, *st[1], *st[2], *st[3], *o_st]
        return _tuned(Launch(op, rope_kernel, (programs,), args, meta), n_rows, d, 3)
    return None


ROW_OPS = frozenset({"rms_norm", "layer_norm", "softmax", "log_softmax", "rope"})
