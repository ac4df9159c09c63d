"""A gemm on a weight stored in a format, quantized (int8 per channel, int4 group-wise:
formats/quant_formats.py), half precision (fp16, bf16: formats/half.py) or sparse (2:4, 16 x 16
blocks: formats/sparse_formats.py), as one call of its kernel: `eq_gemm_q` (quant_gemm.py), which
dequantizes (widens) in registers, `eq_gemm_w8a8` (w8a8_gemm.py: int8_dynamic, activations coded per
row and multiplied in integers), or `eq_gemm_sparse` (sparse_gemm.py), which skips what is not
stored. They stream the weight once for all rows at few rows (the GEMV of decode, bound by the
weight's bytes) and run float tiles at more.

The descriptor maps onto the call: alpha; the residual or bias as an addend of the tile
epilogue (bias times beta); the activation; the SwiGLU pair (the weight's two column halves).
The rms_norm prologue normalises FORMAT_ROW_BLOCK rows (tiles.py) at a time into a local
buffer, x * 1/rms * g as the reference rounds it, and runs the call on them (a panel is
dequantized once per block: 1/64 of the block's multiply-adds at 32 rows)."""

from __future__ import annotations

from dataclasses import replace

from ...formats.half_formats import WEIGHT_FORMATS as HALF_FORMATS
from ...formats.quant_formats import DYNAMIC_STORED, format_group, is_nibbles
from ...ops import ACTIVATIONS, GemmDescriptor, operands_of
from .emit_norm import inv_rms
from .gemm_geometry import GemmGeometry, gemm_geometry
from .loops import PARALLEL_MIN
from .quant_gemm import QuantPanels, format_code, format_library
from .sparse_gemm import SPARSE_GEMM
from .static_c import StaticLibrary, calling
from .tiles import FORMAT_MAX_K, FORMAT_ROW_BLOCK, QUANT_PANEL
from .values import Layout, Ref
from .w8a8_gemm import W8A8_GEMM, W8A8Panels


def prepared_operands(node) -> frozenset[int]:
    """The inputs of `node` its kernel reads only through a prepared copy (so they need no C
    type): a half-precision gemm weight, whose bits the panels carry."""
    if node.op == "gemm" and GemmDescriptor.of(node.attrs).half or \
            node.op == "expert_mm" and node.attrs["weight"] in HALF_FORMATS:
        return frozenset({1})
    return frozenset()


def emit_format_gemm(d: GemmDescriptor, out: Ref, ins: list[Ref], geo: GemmGeometry,
                     layout: Layout | None = None) -> str | None:
    """The call for the gemm descriptor d on [x, w, aux, norm, addend], w in format
    d.weight and aux its scales or positions (geo: x and out, no B); None where the
    operands' layout or dtypes are not the kernel's (a quantized weight must be a constant:
    its panels are prepared in `layout`)."""
    g = operands_of("gemm", ins)
    x, w, aux, norm, addend = g.x, g.w, g.w_scale, g.norm, g.addend
    fmt, epilogue = d.weight, d.epilogue
    if out.dtype != "float32" or x.dtype != "float32":
        return None
    if not geo.rows_evenly_spaced or not geo.unit_columns:  # (before the panels take W slots)
        return None
    swiglu = epilogue == "swiglu"
    m, k, n = geo.m, geo.k, geo.n
    stored = _sparse_operands(fmt, w, aux) if d.sparse else \
        _dynamic_operands(w, aux, n, swiglu, layout) if d.dynamic else \
        quantized_operands(fmt, w, aux, n, swiglu, layout)
    if stored is None:
        return None
    library, operands = stored  # (the library whose one entry point the call is)
    kernel = library.entry_points[0]
    addends = []
    if epilogue in ("add", "bias"):  # an addend of the tile epilogue, walked with C's rows
        with_r = gemm_geometry(out, x, None, addend)
        r = with_r.r if with_r is not None and with_r.rows_evenly_spaced else None
        if r is None or addend.dtype != "float32" or addend.space == "scalar" or \
                r.cols not in (0, 1):
            return None
        beta = float(d.beta) if epilogue == "bias" else 1.0
        addends.append(f"{{{addend.ptr()}, {r.rows if m > 1 else 0}, {r.cols}, {beta.hex()}f}}")
    act = 0 if d.act == "none" else ACTIVATIONS[d.act].code
    e = f"const eq_addend e[] = {{{', '.join(addends)}}};" if addends else \
        "const eq_addend* e = NULL;"
    par = geo.macs >= PARALLEL_MIN * 8 and n >= 64
    alpha = float(d.alpha).hex()

    def call(rows: str, a: str, lda_: int, row0: str) -> str:
        es = "e" if not addends else "eb"
        shift = "" if not addends else (
            f"eq_addend eb[1] = {{e[0]}}; eb[0].p += ({row0}) * e[0].rs;\n    ")
        return (f"{shift}{kernel}({rows}, {n}, {k}, {a}, {lda_}, {operands}, "
                f"o + ({row0}) * {geo.ldc}, {geo.ldc}, "
                f"{alpha}f, NULL, {es}, {len(addends)}, {act}, "
                f"{int(swiglu)}, {int(par)});")

    head = f"{e}\nfloat* o = {out.ptr(const=False)};\nconst float* x = {x.ptr()};"
    if not d.normed:
        return calling(f"{head}\n{{\n    {call(str(m), 'x', geo.lda, '0')}\n}}", library)
    if k > FORMAT_MAX_K or norm.dtype not in ("float32", "float64") or len(norm.shape) > 1:
        return None
    g = f"(float){norm.literal('double')}" if norm.space == "scalar" else \
        f"g[c * {norm.strides[-1] if norm.shape and norm.shape[0] != 1 else 0}]"
    g_decl = "" if norm.space == "scalar" else f"\nconst float* g = {norm.ptr()};"
    blk = min(FORMAT_ROW_BLOCK, m)
    return calling(f"""{head}{g_decl}
float xn[{blk} * {k}] __attribute__((aligned(64)));
for (int64_t m0 = 0; m0 < {m}; m0 += {blk}) {{
    const int64_t mb = {m} - m0 < {blk} ? {m} - m0 : {blk};
    for (int64_t i = 0; i < mb; i++) {{
        const float* xr = x + (m0 + i) * {geo.lda};
        float* nr = xn + i * {k};
{inv_rms("xr", "1", k, float(d.eps))}
#pragma omp simd
        for (int64_t c = 0; c < {k}; c++) nr[c] = xr[c] * r * {g};
    }}
    {call("mb", "xn", k, "m0")}
}}""", library)


def quantized_operands(fmt: str, w: Ref, scales: Ref, n: int, swiglu: bool,
                       layout: Layout | None) -> tuple[StaticLibrary, str] | None:
    """QUANT_GEMM as format_library gives it for this format (eq_gemm_q) and its weight
    arguments: format code, group, the integers
    (half formats: the values) and the scales (half formats: NULL), as quantized_panels."""
    panels = quantized_panels(fmt, w, scales, n, swiglu, layout)
    if panels is None:
        return None
    code, group, wq, ws = panels
    return format_library(code), f"{code}, {group}, {wq.ptr()}, {ws.ptr() if ws else 'NULL'}"


def quantized_panels(fmt: str, w: Ref, scales: Ref, n: int, swiglu: bool,
                     layout: Layout | None) -> tuple[int, int, Ref, Ref | None] | None:
    """eq_gemm_q's format code and group, and the W slots of the integers (half formats:
    the values) and the scales (half formats: none) as QuantPanels prepares them (panels of
    QUANT_PANEL columns; a SwiGLU weight's two halves apart)."""
    half = HALF_FORMATS.get(fmt)
    # (int4_dynamic: int4_g32's operands, the activations coded in the kernel)
    stored = DYNAMIC_STORED.get(fmt, fmt)
    group = 0 if half else format_group(stored)
    if len(w.shape) != 2 or w.strides[1] != 1 or layout is None:
        return None
    halves = 2 if swiglu else 1
    qname = layout.constant_name(w)
    if w.shape[1] != halves * n or qname is None or (half and w.dtype != half):
        return None
    pq = QuantPanels(qname, w.offset, w.shape[0], n, w.strides[0], halves)
    if half:
        wq = layout.prepared(pq, (pq.panels(), pq.rows, QUANT_PANEL), "int16")  # (the values' bits)
        return format_code(fmt), 0, wq, None
    if scales.dtype != "float32" or scales.strides[-1] != 1 or scales.shape[-1] != halves * n:
        return None
    rows_stored = 2 if is_nibbles(stored) else 1  # (rows of W a stored row holds)
    if group and (len(scales.shape) != 2 or w.shape[0] * rows_stored != scales.shape[0] * group):
        return None
    sname = layout.constant_name(scales)
    if sname is None:
        return None
    srows, srs = (scales.shape[0], scales.strides[0]) if group else (1, 0)
    ps = QuantPanels.of_scales(sname, scales.offset, srows, n, srs, halves, stored)
    wq = layout.prepared(pq, (pq.panels(), pq.rows, QUANT_PANEL), w.dtype)
    ws = layout.prepared(ps, (ps.panels(), ps.rows, QUANT_PANEL), ps.c_dtype)
    return format_code(fmt), group, wq, ws


def _dynamic_operands(w: Ref, scales: Ref, n: int, swiglu: bool,
                      layout: Layout | None) -> tuple[StaticLibrary, str] | None:
    """W8A8_GEMM (eq_gemm_w8a8) and its weight arguments: the int8 integers, the scales and
    the integers' column sums, as W8A8Panels prepares them (panels of W8A8_PANEL columns, K
    in groups of W8A8_K_GROUP: tiles.py)."""
    halves = 2 if swiglu else 1
    if layout is None or len(w.shape) != 2 or w.strides[1] != 1 or w.dtype != "int8" or \
            w.shape[1] != halves * n or scales.dtype != "float32" or \
            scales.shape != (halves * n,) or scales.strides != (1,):
        return None
    qname, sname = layout.constant_name(w), layout.constant_name(scales)
    if qname is None or sname is None:
        return None
    pq = W8A8Panels(qname, w.offset, w.shape[0], n, w.strides[0], halves)
    specs = (pq, replace(pq, part="colsum"), W8A8Panels(sname, scales.offset, 1, n, 0, halves,
                                                        "scale"))
    wq, colsum, s = (layout.prepared(p, p.shape(), p.dtype()) for p in specs)
    return W8A8_GEMM, f"{wq.ptr()}, {s.ptr()}, {colsum.ptr()}"


def _sparse_operands(fmt: str, values: Ref, index: Ref) -> tuple[StaticLibrary, str] | None:
    """SPARSE_GEMM (eq_gemm_sparse) and its weight arguments: format code, values,
    positions, row stride."""
    if values.dtype != "float32":
        return None
    if fmt == "sparse24":
        if len(values.shape) != 2 or values.strides[1] != 1 or index.dtype != "uint8" or \
                len(index.shape) != 2 or index.strides != (values.strides[0], 1):
            return None
        code, ldw = 24, values.strides[0]
    else:
        if values.strides != (256, 16, 1) or index.dtype != "int32" or index.strides != (1,):
            return None
        code, ldw = 16, 0
    return SPARSE_GEMM, f"{code}, {values.ptr()}, {index.ptr()}, {ldw}"
