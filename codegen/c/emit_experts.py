"""The mixture-of-experts kernels: a router's top-k (`topk_values`, `topk_indices`) and the
expert GEMM (`expert_mm`, the static library kernels/experts.c: rows grouped by expert, each
chosen expert's weight read once)."""

from __future__ import annotations

from ...ir import Node
from .loops import PARALLEL_MIN, loop_nest
from .static_c import StaticLibrary, calling, kernel_source
from .values import Ref

EXPERTS = StaticLibrary("experts", kernel_source("experts.c"), ("eq_expert_mm",))
TOPK_MAX = 64  # the k a row keeps in registers and on the stack


def emit_topk(node: Node, out: Ref, ins: list[Ref]) -> str | None:
    """Each row's k largest (smallest) values or their indices, by insertion: a router's row
    is a few experts. Ties keep the lower index first; a NaN is never preferred."""
    x = ins[0]
    k, dim = node.attrs["k"], node.attrs["dim"]
    rank = len(x.shape)
    if not rank or dim != rank - 1 or not 0 < k <= min(TOPK_MAX, x.shape[-1]) or \
            x.ctype not in ("float", "double"):
        return None
    better = ">" if node.attrs["largest"] else "<"
    pick = "bv" if node.op == "topk_values" else "bi"
    n, xs, os_ = x.shape[-1], x.strides[-1], out.strides[-1]
    rows = x.shape[:-1]

    def body(offs: list[str]) -> str:
        return f"""    {x.ctype} bv[{k}]; int64_t bi[{k}]; int m = 0;
    for (int64_t e = 0; e < {n}; e++) {{
        const {x.ctype} v = x[{offs[0]} + e * {xs}];
        if (m == {k} && !(v {better} bv[{k - 1}])) continue;
        int j = m < {k} ? m++ : {k - 1};
        while (j > 0 && v {better} bv[j - 1]) {{ bv[j] = bv[j - 1]; bi[j] = bi[j - 1]; j--; }}
        bv[j] = v; bi[j] = e;
    }}
    for (int j = 0; j < {k}; j++) o[{offs[1]} + j * {os_}] = ({out.ctype}){pick}[j];"""
    return (f"const {x.ctype}* x = {x.ptr()};\n{out.ctype}* o = {out.ptr(const=False)};\n"
            + loop_nest(rows, [x.strides[:-1], out.strides[:-1]], body,
                        work=_numel(x.shape), simd=False))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def emit_expert_mm(out: Ref, ins: list[Ref]) -> str | None:
    """out [S, N] = rows of x [S, K] times their experts' weights w [E, K, N]: float32, x's
    rows contiguous along k, w's and out's along n (transformers' [E, N, K] storage is
    transposed once as the program is prepared); other layouts run in torch."""
    x, w, ids = ins
    if not (x.dtype == w.dtype == out.dtype == "float32") or ids.ctype != "int64_t" or \
            len(x.shape) != 2 or len(w.shape) != 3 or len(ids.shape) != 1 or \
            x.strides[1] != 1 or w.strides[2] != 1 or out.strides[1] != 1 or \
            ids.strides[0] != 1:
        return None
    (S, K), (E, _, N) = x.shape, w.shape
    par = int(S * K * N >= PARALLEL_MIN * 8)
    return calling(f"""eq_expert_mm({S}, {K}, {N}, {E}, {x.ptr()}, {x.strides[0]}, {w.ptr()},
             {w.strides[0]}, {w.strides[1]}, {ids.ptr()}, {out.ptr(const=False)},
             {out.strides[0]}, {par});""", EXPERTS)
