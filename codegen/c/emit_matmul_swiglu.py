"""A gemm with the SwiGLU epilogue, swiglu(x @ wg, x @ wu) with [wg | wu] its weight, as one
kernel. With both weights constants and x's rows evenly spaced: one call of the packed GEMM's
SwiGLU variant (packed_gemm.py: each tile's gate and up products joined as they are stored).
Otherwise a row-streaming loop in the same kernel: both products of a row accumulated
locally, in chunks of SWIGLU_CHUNK columns (tiles.py), and joined as they are stored."""

from __future__ import annotations

from ...ops import GemmDescriptor
from .gemm_geometry import GemmGeometry
from .loops import PARALLEL_MIN, loop_nest
from .packed_gemm import PACKED_GEMM
from .static_c import calling
from .tiles import SWIGLU_CHUNK
from .values import Layout, Ref


def emit_matmul_swiglu(d: GemmDescriptor, out: Ref, ins: list[Ref], geo: GemmGeometry,
                       layout: Layout) -> str | None:
    """The kernel of the gemm descriptor d (epilogue swiglu, no activation, alpha 1) on
    [x, w, ...], w = [wg | wu] [k, 2n]; None where it is not generated."""
    x, w = ins[0], ins[1]
    if d.act != "none" or float(d.alpha) != 1.0 or len(w.shape) != 2:
        return None
    k, n = geo.k, geo.n
    wg = w.with_view((k, n), w.strides, w.offset)
    wu = w.with_view((k, n), w.strides, w.offset + n * w.strides[1])
    if any(r.dtype != "float32" for r in (out, x, w)) or len(x.shape) < 2:
        return None
    if geo.rows_evenly_spaced and geo.unit_columns:
        pg, pu = geo.packed_b(wg, layout), geo.packed_b(wu, layout)
        if pg is not None and pu is not None:
            par = 2 * geo.macs >= PARALLEL_MIN * 8 and n >= 64
            return calling(f"eq_gemm_packed_swiglu({geo.m}, {n}, {k}, {x.ptr()}, {geo.lda}, "
                           f"{pg.ptr()}, {pu.ptr()}, {out.ptr(const=False)}, {geo.ldc}, "
                           f"{int(par)});", PACKED_GEMM)
    b, cx, co, chunk = geo.b, geo.a.cols, geo.c.cols, SWIGLU_CHUNK
    assert b is not None

    def row(o: list[str]) -> str:
        return f"""    const float* xr = xp + {o[0]};
    float* orow = op + {o[1]};
    for (int64_t n0 = 0; n0 < {n}; n0 += {chunk}) {{
        const int64_t nn = {n} - n0 < {chunk} ? {n} - n0 : {chunk};
        float g[{chunk}], u[{chunk}];
        for (int64_t j = 0; j < nn; j++) {{ g[j] = 0.0f; u[j] = 0.0f; }}
        for (int64_t k = 0; k < {k}; k++) {{
            const float xv = xr[k * {cx}];
            for (int64_t j = 0; j < nn; j++) {{
                g[j] += xv * gp[k * {b.rows} + (n0 + j) * {b.cols}];
                u[j] += xv * up[k * {b.rows} + (n0 + j) * {b.cols}];
            }}
        }}
        for (int64_t j = 0; j < nn; j++) orow[(n0 + j) * {co}] = g[j] * eq_sigmoidf(g[j]) * u[j];
    }}"""

    return (f"const float* xp = {x.ptr()};\nconst float* gp = {wg.ptr()};\n"
            f"const float* up = {wu.ptr()};\nfloat* op = {out.ptr(const=False)};\n"
            + loop_nest(geo.row_shape, [geo.row_strides(geo.a), geo.row_strides(geo.c)], row,
                        work=geo.macs // 8, simd=False))
