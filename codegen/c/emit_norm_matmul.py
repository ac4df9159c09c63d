"""A gemm with the rms_norm prologue, alpha * rms_norm(x, g, eps) @ w, as one kernel.

Fused (g and w constants, x and the output with unit column stride and evenly spaced rows):
w is packed once as it is (the same panels as every other GEMM on w: a Generator's two
programs share them), and rms_norm(x, g) @ w = diag(inv_rms) ((x * g) @ w). Per block of
NORM_ROW_BLOCK rows (tiles.py) the kernel computes inv_rms[m] = 1 / sqrt(mean(x[m]^2) + eps)
into a local array and x * g into a buffer of the calling thread, and runs the packed GEMM
on that, whose epilogue scales each output row by inv_rms[m] while the tile is in L1. (The
reference scales x by inv_rms first: within ~1e-6 relative.) g was once folded into w's
rows instead (`PackedWeight(row_scale=g)`): then each program that fused a different set of
GEMMs held its own row-scaled copy of the weights, 2.5 GB of TinyLlama's 4.4 at fp32.

Otherwise (g or w computed at run time, other strides): each row is normalised into a local
row, exactly as the reference rounds it, and multiplied by w, one row at a time. Nothing is
allocated on the heap: the local arrays are bounded (NORM_ROW_BLOCK; K and N at most
NORM_MAX_LOCAL floats)."""

from __future__ import annotations

import math

from ...ops import GemmDescriptor, operands_of
from .emit_norm import inv_rms
from .fuse_rope import RopeEpilogue, packed_gemm_call
from .gemm_geometry import GemmGeometry
from .loops import PARALLEL_MIN, loop_nest
from .packed_gemm import PACKED_GEMM
from .static_c import calling
from .tiles import NORM_MAX_LOCAL, NORM_ROW_BLOCK
from .values import Layout, Ref


def emit_rms_norm_matmul(d: GemmDescriptor, out: Ref, ins: list[Ref], geo: GemmGeometry,
                         layout: Layout | None = None, ropes: tuple[RopeEpilogue, ...] = ()
                         ) -> str | None:
    """The kernel of the gemm descriptor d (prologue rms_norm, no epilogue nor activation) on
    [x, w, _, g, _]; with `ropes` (fuse_rope.py) computed in the GEMM's epilogue, or None when
    the fused path that can do so does not apply."""
    if d.epilogue != "none" or d.act != "none":
        return None
    operands = operands_of("gemm", ins)
    x, w, g = operands.x, operands.w, operands.norm
    if any(r.dtype != "float32" for r in (out, x, w, g)):
        return None
    if not x.shape or len(w.shape) != 2 or len(g.shape) > 1 or not out.shape:
        return None
    K, N = w.shape
    if geo.k != K or geo.n != N or (g.shape and g.shape[0] not in (1, K)):
        return None
    eps, alpha = float(d.eps), float(d.alpha)
    packed = _packed(geo, w, g, layout)
    if packed is not None and geo.rows_evenly_spaced and geo.unit_columns:
        return calling(_fused(x, g, out, packed, geo, eps, alpha, ropes), PACKED_GEMM)
    if ropes or K > NORM_MAX_LOCAL or N > NORM_MAX_LOCAL:
        return None
    return _rowwise(x, w, g, out, geo, eps, alpha)


def _packed(geo: GemmGeometry, w: Ref, g: Ref, layout: Layout | None) -> Ref | None:
    """w packed, when both w and g are constants (g: a whole constant of K elements)."""
    gname = layout.constant_name(g) if layout is not None else None
    if layout is None or gname is None:
        return None
    groot = layout.refs.get(g.root)
    if g.offset != 0 or groot is None or math.prod(groot.shape) != geo.k or (
            geo.k > 1 and g.strides[-1] != 1):
        return None
    return geo.packed_b(w, layout)


def _fused(x: Ref, g: Ref, out: Ref, packed: Ref, geo: GemmGeometry, eps: float,
           alpha: float, ropes: tuple[RopeEpilogue, ...]) -> str:
    M, K, N, lda, ldc = geo.m, geo.k, geo.n, geo.lda, geo.ldc
    blk = min(NORM_ROW_BLOCK, M)
    par_gemm = blk * N * K >= PARALLEL_MIN * 8 and N >= 64
    fn, rope_decl, rope_args = packed_gemm_call(ropes, "m0")
    return f"""const float* x = {x.ptr()};
const float* g = {g.ptr()};
{rope_decl}
float* o = {out.ptr(const=False)};
float inv[{blk}] __attribute__((aligned(64)));
static __thread float* eq_xg = 0;  /* x * g, a block of rows: the calling thread's */
static __thread int64_t eq_xg_n = 0;
float* xg = eq_grow(&eq_xg, &eq_xg_n, (int64_t){blk} * {K});
if (!xg) {{ EQ_INDEX_ERROR(); return; }}  /* out of memory: flagged, not a crash */
for (int64_t m0 = 0; m0 < {M}; m0 += {blk}) {{
    const int64_t mb = {M} - m0 < {blk} ? {M} - m0 : {blk};
#pragma omp parallel for schedule(static) if(mb * {K} >= {PARALLEL_MIN})
    for (int64_t m = 0; m < mb; m++) {{
        const float* xr = x + (m0 + m) * {lda};
        float* xgr = xg + m * {K};
{inv_rms("xr", "1", K, eps, "inv[m]")}
#pragma omp simd
        for (int64_t k = 0; k < {K}; k++) xgr[k] = xr[k] * g[k];
    }}
    {fn}(mb, {N}, {K}, xg, {K}, {packed.ptr()}, o + m0 * {ldc}, {ldc},
                   {alpha.hex()}f, inv, NULL, 0, 0, {int(par_gemm)}{rope_args});
}}"""


def _rowwise(x: Ref, w: Ref, g: Ref, out: Ref, geo: GemmGeometry, eps: float,
             alpha: float) -> str:
    """One row at a time: xn = x * inv_rms * g (the reference's rounding), then xn @ w."""
    K, N, a, b, c = geo.k, geo.n, geo.a, geo.b, geo.c
    assert b is not None
    csg = g.strides[-1] if g.shape and g.shape[0] != 1 else 0
    scale = "" if alpha == 1.0 else f" * {alpha.hex()}f"

    def body(offs: list[str]) -> str:
        return f"""    const float* xr = x + {offs[0]};
    float* orow = o + {offs[1]};
    float xn[{K}] __attribute__((aligned(64)));
    float acc[{N}] __attribute__((aligned(64)));
{inv_rms("xr", str(a.cols), K, eps)}
#pragma omp simd
    for (int64_t c = 0; c < {K}; c++) xn[c] = xr[c * {a.cols}] * r * gg[c * {csg}];
    for (int64_t n = 0; n < {N}; n++) acc[n] = 0.0f;
    for (int64_t k = 0; k < {K}; k++) {{
        const float av = xn[k];
        const float* br = ww + k * {b.rows};
#pragma omp simd
        for (int64_t n = 0; n < {N}; n++) acc[n] += av * br[n * {b.cols}];
    }}
#pragma omp simd
    for (int64_t n = 0; n < {N}; n++) orow[n * {c.cols}] = acc[n]{scale};"""
    return (f"const float* x = {x.ptr()};\nfloat* o = {out.ptr(const=False)};\n"
            f"const float* gg = {g.ptr()};\nconst float* ww = {w.ptr()};\n"
            + loop_nest(geo.row_shape, [geo.row_strides(a), geo.row_strides(c)], body,
                        work=geo.macs, simd=False))
