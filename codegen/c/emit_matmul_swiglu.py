"""A gemm with the SwiGLU epilogue, swiglu(x @ wg, x @ wu) with [wg | wu] its weight, as one
kernel. With both weights
constants and x's rows evenly spaced: one call of the packed GEMM's SwiGLU variant
(packed_gemm.py: each tile's gate and up products joined as they are stored). Otherwise a
row-streaming loop in the same kernel: both products of a row accumulated locally, in chunks
of CHUNK columns, and joined as they are stored."""

from __future__ import annotations

from .loops import PARALLEL_MIN, collapse, loop_nest
from .values import Layout, Ref

CHUNK = 256


def emit_matmul_swiglu(out: Ref, x: Ref, wg: Ref, wu: Ref, layout: Layout) -> str | None:
    if any(r.dtype != "float32" for r in (out, x, wg, wu)) or len(x.shape) < 2 \
            or len(wg.shape) != 2 or wg.shape != wu.shape:
        return None
    k, n = wg.shape
    rows_shape = out.shape[:-1]
    sh, st = collapse(rows_shape, [x.strides[:-1], out.strides[:-1]])
    if len(sh) <= 1 and x.strides[-1] == 1 and out.strides[-1] == 1:
        pg = layout.packed_weight(wg, k, n, *wg.strides)
        pu = layout.packed_weight(wu, k, n, *wu.strides)
        if pg is not None and pu is not None:
            m = sh[0] if sh else 1
            rs_x, rs_o = (st[0][0], st[1][0]) if sh else (k, n)
            par = 2 * m * n * k >= PARALLEL_MIN * 8 and n >= 64
            return (f"eq_gemm_packed_swiglu({m}, {n}, {k}, {x.ptr()}, {rs_x}, {pg.ptr()}, "
                    f"{pu.ptr()}, {out.ptr(const=False)}, {rs_o}, {int(par)});")
    (rg, cg), (ru, cu) = wg.strides, wu.strides
    cx, co = x.strides[-1], out.strides[-1]

    def row(o: list[str]) -> str:
        return f"""    const float* xr = xp + {o[0]};
    float* orow = op + {o[1]};
    for (int64_t n0 = 0; n0 < {n}; n0 += {CHUNK}) {{
        const int64_t nn = {n} - n0 < {CHUNK} ? {n} - n0 : {CHUNK};
        float g[{CHUNK}], u[{CHUNK}];
        for (int64_t j = 0; j < nn; j++) {{ g[j] = 0.0f; u[j] = 0.0f; }}
        for (int64_t k = 0; k < {k}; k++) {{
            const float xv = xr[k * {cx}];
            for (int64_t j = 0; j < nn; j++) {{
                g[j] += xv * gp[k * {rg} + (n0 + j) * {cg}];
                u[j] += xv * up[k * {ru} + (n0 + j) * {cu}];
            }}
        }}
        for (int64_t j = 0; j < nn; j++) orow[(n0 + j) * {co}] = g[j] * eq_sigmoidf(g[j]) * u[j];
    }}"""

    rows = 1
    for d in rows_shape:
        rows *= d
    return (f"const float* xp = {x.ptr()};\nconst float* gp = {wg.ptr()};\n"
            f"const float* up = {wu.ptr()};\nfloat* op = {out.ptr(const=False)};\n"
            + loop_nest(rows_shape, [x.strides[:-1], out.strides[:-1]], row,
                        work=rows * n * k // 8, simd=False))
